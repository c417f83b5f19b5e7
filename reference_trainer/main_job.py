"""The LIBERO main job's steps around the trainer: its checks (before any worker starts),
its config (run name, deadline, evaluation sizes), the --from-scratch recipe and the
line that says what it will do."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from reference_trainer.init_states import check_init_states, eval_episode_counts
from reference_trainer.job_report import job_mode
from reference_trainer.progress_bar import TrainingBar
from reference_trainer.warm_start import check_expert

__all__ = ["check_job", "describe_job", "job_config", "job_progress", "scratch_recipe"]


def check_job(config: Any, tasks: list[int]) -> None:
    """Raise ValueError for flags that do not go together, before any worker starts.

    Raises:
        ValueError: for both --from-scratch and --bc-control, --resume without
            --from-scratch, evaluation init states a demo or training uses, or a --suite
            without a scripted expert.
    """
    if config.from_scratch and config.bc_control:
        raise ValueError("--from-scratch and --bc-control are exclusive")
    if config.resume and not config.from_scratch:
        raise ValueError(
            "--resume continues a --from-scratch run only: the fine-tuning recipe and "
            "--bc-control start a new run from new demos and BC (--init-checkpoint, which "
            "--resume excludes)"
        )
    check_init_states(config)
    check_expert(config, tasks)


def job_config(config: Any, tasks: list[int], started: float) -> Any:
    """The config the job runs with: a run name (default: suite, tasks, mode, seed and
    process id), the deadline ``--budget-minutes`` after ``started`` (seconds since the
    epoch) and the evaluations' episode counts (`eval_episode_counts`).

    Raises:
        ValueError: as `eval_episode_counts`.
    """
    if config.run_name is None:
        which = "all" if config.task_id is None else f"task{config.task_id}"
        name = f"{config.suite}_{which}_{job_mode(config)}__s{config.seed}__{os.getpid()}"
        config = dataclasses.replace(config, run_name=name)
    budget = config.budget_minutes
    config = dataclasses.replace(config, deadline=None if budget is None else started + 60 * budget)
    return eval_episode_counts(config, tasks)


def scratch_recipe(config: Any) -> Any:
    """--from-scratch: the fine-tuning's extras off (KL pull, value warm-up, frozen
    observation normaliser, per-dimension std, actor learning rate, target KL,
    self-imitation)."""
    return dataclasses.replace(
        config,
        kl_coef=0.0,
        value_warmup_iterations=0,
        freeze_obs_norm=False,
        init_log_std_per_dim=(),
        explore_dims=(),
        actor_learning_rate=None,
        target_kl=None,
        self_imitation_steps=0,
    )


def describe_job(config: Any, tasks: list[int]) -> str:
    """One line: the job's steps, the suite and tasks, and its budget."""
    steps = (
        "PPO from scratch"
        if config.from_scratch
        else "demos -> BC -> evaluate -> "
        + ("longer BC" if config.bc_control else "PPO fine-tuning")
        + " -> evaluate"
    )
    which = f"task {tasks[0]}" if len(tasks) == 1 else f"tasks {tasks[0]}-{tasks[-1]} (one policy)"
    budget = (
        "no time budget"
        if config.budget_minutes is None
        else f"all within {config.budget_minutes:g} min"
    )
    return f"{steps} on {config.suite} {which}, {budget}"


def job_progress(config: Any, started: float) -> TrainingBar:
    """One bar for the whole job, opened at its start (demos, BC, evaluations, training):
    the seconds of ``--budget-minutes`` from ``started``, or env steps without a budget;
    `train` continues it and the job closes it, full."""
    budget_s = None if config.budget_minutes is None else 60.0 * config.budget_minutes
    return TrainingBar(None, 0, budget_s, "setting up", config.progress, started=started)
