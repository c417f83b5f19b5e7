"""The main job's pictures: ``learning_curve.png`` (held-out success at every evaluation,
the training episodes' success below) and ``per_task.png`` (each task before and after)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["after_label", "plot_learning_curve", "plot_per_task"]


def after_label(summary: dict[str, Any]) -> str:
    """What the final evaluation comes after: "after longer BC" (the control), "after RL",
    or, for a run whose policy no update changed (a budget too short for training, or
    for more than the value warm-up, which trains the critic alone), "after no RL"."""
    if summary["mode"] == "bc_control":
        return "after longer BC"
    if summary.get("too_short_for_training") or not summary.get("actor_update_iterations"):
        return "after no RL"
    return "after RL"


def plot_learning_curve(summary: dict[str, Any], curves: dict[str, Any], path: Path) -> str | None:
    """Held-out success at every evaluation (the suite's) against env steps,
    and the training episodes' success below; for ``--bc-control``, against the minutes
    of further BC, with that BC's per-epoch action errors below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    control = summary["mode"] == "bc_control"
    evaluations = [e for e in summary.get("evaluations") or [] if "success_rate" in e]
    fig, (ax_e, ax_t) = plt.subplots(
        2, 1, figsize=(8, 6.5), sharex=not control, gridspec_kw={"height_ratios": [3, 2]}
    )
    if evaluations:
        _plot_evaluations(ax_e, evaluations, "bc_minutes" if control else "global_step")
    ax_e.set_ylim(-0.05, 1.15)
    ax_e.set_ylabel("held-out success rate")
    ax_e.set_title(
        "held-out init states (no demo or training episode used them), deterministic policy; "
        "each task: per_task.png",
        fontsize=9,
    )
    ax_e.legend(loc="best", fontsize=8)  # off the points, wherever they are
    if control:
        ax_e.set_xlabel("minutes of further BC")
        _plot_bc_curve(ax_t, curves.get("bc_long_curve") or [])
    else:
        curve = curves.get("success_curve") or []
        if curve:
            x, y = zip(*curve, strict=True)
            k = max(1, min(25, len(y) // 8))
            ax_t.plot(x[k - 1 :], np.convolve(np.asarray(y), np.ones(k) / k, "valid"), color="C2")
        else:
            ax_t.text(0.5, 0.5, "no training episode ended", transform=ax_t.transAxes, ha="center")
        ax_t.set_ylim(-0.05, 1.05)
        ax_t.set_ylabel("training episodes'\nsuccess (exploring)")
        ax_t.set_xlabel("env steps")
    fig.suptitle(f"{summary['mode']}: {Path(summary['run_dir']).name}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _plot_bc_curve(ax: Any, curve: list[list[float]]) -> None:
    """BC's training and held-out action MSE per epoch (``[epoch, train, heldout]`` rows)."""
    if curve:
        epochs, train_mse, heldout_mse = zip(*curve, strict=True)
        ax.plot(epochs, train_mse, color="0.6", label="training demos")
        ax.plot(epochs, heldout_mse, color="C1", label="held-out demos")
        ax.set_yscale("log")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_ylabel("longer BC's\naction MSE")
    ax.set_xlabel("BC epoch")


def _plot_evaluations(ax: Any, evaluations: list[dict[str, Any]], x: str = "global_step") -> None:
    """The suite's held-out success at every evaluation (against its value ``x``): the full
    evaluations (before, after) as large blue circles, each labelled with its value and
    which it is beside it; the smaller ones during training as small orange diamonds with
    their value below (above, near 0). No line joins the points: the evaluations are
    measured at these points only, and a subset of 10 episodes moves 0.1 per episode. The
    legend gives their episode counts; each task's rates are left to per_task.png."""
    full = [e for e in evaluations if not e.get("subset")]
    subset = [e for e in evaluations if e.get("subset")]
    for group, marker, color, size, when in (
        (full, "o", "C0", 10, "before and after training"),
        (subset, "D", "C1", 6, "during training"),
    ):
        if not group:
            continue
        episodes = sorted({int(e["episodes"]) for e in group})
        states = max(len(e.get("init_states") or ()) for e in group)
        ax.plot(
            [e[x] for e in group],
            [e["success_rate"] for e in group],
            marker,
            color=color,
            markersize=size,
            zorder=3,
            label=f"{when}: {'/'.join(map(str, episodes))} held-out episodes"
            + (f" ({states} init state{'s' * (states != 1)} per task)" if states else ""),
        )
    # room on the right for the label beside the last point
    xs = [e[x] for e in evaluations]
    span = (max(xs) - min(xs)) or 1.0
    ax.set_xlim(min(xs) - 0.04 * span, max(xs) + 0.16 * span)
    for i, e in enumerate(full):  # beside its point, right of it; one in between above it
        which = "before" if i == 0 else "after" if i == len(full) - 1 else ""
        beside = bool(which)
        ax.annotate(
            f"{which} {e['success_rate']:.2f}".strip(),
            (e[x], e["success_rate"]),
            xytext=(9, 0) if beside else (0, 10),
            textcoords="offset points",
            ha="left" if beside else "center",
            va="center" if beside else "bottom",
            fontsize=10,
            fontweight="bold",
            color="C0",
        )
    for e in subset:  # below the marker (above it near 0), smaller, in the subset's colour
        low = e["success_rate"] < 0.15
        ax.annotate(
            f"{e['success_rate']:.2f}",
            (e[x], e["success_rate"]),
            xytext=(0, 8 if low else -8),
            textcoords="offset points",
            ha="center",
            va="bottom" if low else "top",
            fontsize=8,
            color="C1",
        )


def plot_per_task(summary: dict[str, Any], path: Path) -> str | None:
    """Each task's held-out success before and after as paired bars with their values,
    labelled with its language instruction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = summary.get("eval_success_rate_per_task_initial")
    after = summary.get("eval_success_rate_per_task_final")
    if not before or not after:
        return None
    labels = [
        f"{t}: {text}"
        for t, text in zip(summary["tasks"], summary["language_instructions"], strict=True)
    ]
    y = np.arange(len(labels))[::-1]
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.5 * len(labels)))
    ax.barh(
        y + 0.2,
        before,
        0.4,
        color="0.65",
        label=f"before (BC): suite {summary['eval_success_rate_initial']:.2f}",
    )
    ax.barh(
        y - 0.2,
        after,
        0.4,
        color="C0",
        label=f"{after_label(summary)}: suite {summary['eval_success_rate_final']:.2f}",
    )
    for offset, rates in ((0.2, before), (-0.2, after)):
        for row, rate in zip(y, rates, strict=True):  # the value, so a 0 reads as one
            ax.text(rate + 0.01, row + offset, f"{rate:.1f}", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlim(0, 1.08)
    ax.set_xlabel(
        f"held-out success rate ({summary['eval_episodes'] // len(labels)} episodes per task)"
    )
    # above the axes, so no bar (a task at 1.0 included) is hidden under it
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
