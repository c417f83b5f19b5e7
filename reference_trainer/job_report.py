"""The main job's outputs after its last step: ``summary.json`` (the summary first),
``curves.json``, the pictures (`reference_trainer.job_plots`) and the closing report."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from reference_trainer.job_plots import after_label, plot_learning_curve, plot_per_task

__all__ = ["CURVE_KEYS", "SUMMARY_KEYS", "job_mode", "report", "write_report", "write_summary"]

SUMMARY_KEYS = ("eval_success_rate_initial", "eval_success_rate_final", "eval_episodes")
"""Keys of ``summary.json`` that outside checks read (the suite's mean and episode count)."""
CURVE_KEYS = ("return_curve", "success_curve", "bc_curve", "bc_long_curve")
"""What `write_summary` moves from the summary to ``curves.json``: the training episodes' return
and success per iteration, the warm start's BC and the control's longer BC per epoch."""


def job_mode(config: Any) -> str:
    """The run's mode: "scratch", "bc_control" or "finetune"."""
    return "scratch" if config.from_scratch else "bc_control" if config.bc_control else "finetune"


def write_summary(
    summary: dict[str, Any],
    config: Any,
    tasks: list[int],
    run_dir: Path,
    start: float,
    load_start: tuple[float, float, float],
) -> dict[str, Any]:
    """Order the summary (the pinned keys, the per-task rates, then the rest), move the
    per-iteration curves to ``curves.json``, draw the pictures, write ``summary.json``."""
    from pipelined_vec_env.libero import suites
    from reference_trainer.libero_tasks import per_task_success, per_task_training_success

    evaluations = summary.get("evaluations") or []
    final = summary.get("final_eval")
    per_env = summary.get("train_success_per_env")  # None when no episode flagged success
    first = evaluations[0] if evaluations and evaluations[0]["iteration"] == 0 else None

    def per_task(entry: dict[str, Any] | None) -> list[float] | None:
        if entry is None or not entry.get("successes"):
            return None
        return per_task_success(entry["successes"], len(tasks))

    eval_ids = config.init_states("eval")
    for entry in evaluations:
        entry["success_rate_per_task"] = per_task(entry)
        # episode j: task j % T from the (j // T)-th eval init state; a subset: the first
        entry["init_states"] = list(eval_ids[: math.ceil(int(entry["episodes"]) / len(tasks))])
    curves = {k: summary.pop(k) for k in CURVE_KEYS if k in summary}
    (run_dir / "curves.json").write_text(json.dumps(curves))
    ordered: dict[str, Any] = {key: summary.get(key) for key in SUMMARY_KEYS}
    ordered.update(
        {
            "eval_success_rate_per_task_initial": per_task(first),
            "eval_success_rate_per_task_final": per_task(final),
            **{
                f"train_success_rate_per_task_{half}": per_env
                and per_task_training_success(per_env[half], len(tasks))
                for half in ("first_half", "second_half")
            },
            "suite": config.suite,
            "tasks": tasks,
            "language_instructions": [suites.get_task(config.suite, t).language for t in tasks],
            "mode": job_mode(config),
            "init_states": {w: list(config.init_states(w)) for w in ("demo", "train", "eval")},
            "global_step": summary.get("global_step"),
            "total_wall_s": time.time() - start,
            "started_at": start,
            "budget_minutes": config.budget_minutes,
            "loadavg_start": list(load_start),
            "loadavg_end": list(os.getloadavg()),
            "cpu_count": os.cpu_count(),
            "run_dir": str(run_dir),
        }
    )
    ordered.update({k: v for k, v in summary.items() if k not in ordered})
    ordered["learning_curve"] = plot_learning_curve(ordered, curves, run_dir / "learning_curve.png")
    ordered["per_task_plot"] = plot_per_task(ordered, run_dir / "per_task.png")
    ordered["curves"] = str(run_dir / "curves.json")
    (run_dir / "summary.json").write_text(json.dumps(ordered, indent=2, default=str))
    return ordered


def report(summary: dict[str, Any]) -> str:
    """The closing report: success before and after, per task, steps, time, files."""

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    episodes = f"({summary['eval_episodes']} deterministic episodes on held-out init states)"
    lines = ["", f"run directory: {summary['run_dir']} ({summary['mode']})"]
    too_short = summary.get("too_short_for_training")
    if too_short:
        lines += [
            f"success rate:  {fmt(summary['eval_success_rate_initial'])} before {episodes}",
            "no RL:         the budget was too short for training: one iteration and the "
            f"final evaluation needed about {too_short['needed_s']:.0f} s, "
            f"{too_short['had_s']:.0f} s were left",
        ]
    else:
        lines.append(
            f"success rate:  {fmt(summary['eval_success_rate_initial'])} before -> "
            f"{fmt(summary['eval_success_rate_final'])} {after_label(summary)} {episodes}"
        )
    if (
        summary["mode"] != "bc_control"
        and not too_short
        and not summary.get("actor_update_iterations")
    ):
        lines.append(
            f"no RL:         {summary.get('iterations', 0)} iterations, all of the value "
            "warm-up (the critic alone): the budget ended before the policy was updated"
        )
    before = summary.get("eval_success_rate_per_task_initial") or []
    after = summary.get("eval_success_rate_per_task_final") or []
    if len(summary["tasks"]) > 1 and before and after:
        first = summary.get("train_success_rate_per_task_first_half") or [None] * len(before)
        second = summary.get("train_success_rate_per_task_second_half") or [None] * len(before)
        trained = any(v is not None for v in first + second)
        lines.append(
            "  per task, held-out before -> after"
            + (" (training episodes: first -> second half)" if trained else "")
        )
        for t, text, b, a, f, s in zip(
            summary["tasks"],
            summary["language_instructions"],
            before,
            after,
            first,
            second,
            strict=True,
        ):
            training = "" if f is None and s is None else f" (training {fmt(f)} -> {fmt(s)})"
            lines.append(f"  task {t}: {b:.2f} -> {a:.2f}{training}  {text}")
    if "demos" in summary:
        d, b = summary["demos"], summary["bc"]
        lines.append(
            f"demos, BC:     {d['kept']} expert demos ({d['steps']:,} steps, {d['wall_s']:.0f} s); "
            f"BC {b['wall_s']:.0f} s"
        )
    throughput = summary.get("throughput") or {}
    if throughput.get("env_steps_per_s_rollout"):
        lines.append(
            f"training:      {summary['global_step']:,} env steps, "
            f"{throughput['env_steps_per_s_rollout']:.0f} env steps/s in rollouts, "
            f"{summary.get('iterations', 0)} iterations "
            f"({summary.get('actor_update_iterations', 0)} after the value warm-up)"
        )
    budget = summary["budget_minutes"]
    lines.append(
        f"whole command: {summary['total_wall_s']:.0f} s"
        + ("" if budget is None else f" (budget {budget:g} min)")
        + f", load average {summary['loadavg_end'][1]:.1f} at the end"
    )
    videos = [e["video"] for e in summary.get("evaluations", []) if e.get("video")]
    pictures = [p for p in (summary.get("learning_curve"), summary.get("per_task_plot")) if p]
    for what, files in (("video", videos), ("picture", pictures)):
        if files:  # "video:" for one file, "videos:" for more
            lines.append(f"{what + 's' * (len(files) > 1) + ':':15}{', '.join(files)}")
    lines.append(json.dumps({"summary": os.path.join(summary["run_dir"], "summary.json")}))
    return "\n".join(lines)


def write_report(summary: dict[str, Any], log: Path) -> str:
    """The closing report (`report`), appended to the run's ``log`` as it is printed."""
    text = report(summary)
    with open(log, "a", encoding="utf-8") as file:
        file.write(text + "\n")
    return text
