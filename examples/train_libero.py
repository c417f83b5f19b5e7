"""The main job: PPO fine-tuning of one behaviour-cloned policy on a whole LIBERO suite.

With no arguments this trains one policy on the ten libero_object tasks, all within
``--budget-minutes`` 15 for the whole command on a 2-core CPU, in five steps:

1. demos: a scripted expert (privileged sim state) plays ``--demo-init-states`` (6 init
   states of every task, no noise), ten envs (one per task) in one `PipelinedVectorEnv`;
2. BC: the PPO actor (goal features, a 2x128 MLP) is cloned on all of them;
3. evaluate: the BC policy, deterministic, on ``--eval-init-states`` of every task (5 per
   task, 50 episodes, init states no demo and no training episode uses);
4. PPO fine-tuning from the BC weights (value warm-up, a low per-dimension std, a KL pull
   to the BC policy, self-imitation), env ``i`` training on task ``i % 10`` from
   ``--train-init-states``, a 2-stage pipelined rollout, evaluated again every
   ``--eval-every-minutes`` on the first of the held-out init states of every task
   (``--eval-during-init-states`` 1: 10 episodes), until the deadline leaves just enough
   time for
5. evaluate: the same 50 episodes as step 3, and a video of its episode 0.

It prints the suite's and every task's success before and after RL and writes, in the run
directory: ``summary.json`` (the summary first: ``eval_success_rate_initial``,
``eval_success_rate_final``, ``eval_episodes``, the per-task rates and instructions),
``curves.json`` (per-iteration training curves, BC's per epoch), ``learning_curve.png``
(held-out success at every evaluation: before, during, after), ``per_task.png`` (each task before
and after), ``videos/after.mp4``, ``train.log``, the demos, the BC
checkpoint and the trainer's checkpoints and TensorBoard files.

``--task-id N`` trains on task N alone; ``--suite`` picks another suite with a scripted
expert (`reference_trainer.libero_tasks.expert_for`; any suite with ``--from-scratch``). ``--bc-control`` is the control of the fine-tuning: the
same demos and evaluations, but the minutes RL would get go to a longer BC run.
``--from-scratch``: PPO from a random policy (no demos, no BC).
"""

# ruff: noqa: E402 - the clock below starts before the heavy imports
from __future__ import annotations

import time

STARTED_AT = time.time()
"""When this script began (seconds since the epoch): --budget-minutes counts from here,
the imports below included. Not the process's start: a shell that hands its process to
Python (``bash -c 'bash scripts/install.sh && python examples/train_libero.py'``) would
put the install inside the budget."""

import dataclasses
import functools
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import tyro

from reference_trainer.cli import Group, grouped_class, parse_grouped
from reference_trainer.config import NumStages, TrainConfig
from reference_trainer.libero_tasks import (
    EXPERT_SUITES,
    TASK_ONE_HOT_KEY,
    TaskInitStates,
    TaskOneHot,
    expert_for,
)
from reference_trainer.run_log import LOG_FORMAT, RunLog
from reference_trainer.train import (
    FINISH_MARGIN_S,
    eval_estimate,
    run_directory,
    train,
    video_estimate,
)

SUMMARY_KEYS = ("eval_success_rate_initial", "eval_success_rate_final", "eval_episodes")
"""Keys of ``summary.json`` that outside checks read (the suite's mean and episode count)."""
CURVE_KEYS = ("return_curve", "success_curve", "bc_curve", "bc_long_curve")
"""What `_finish` moves from the summary to ``curves.json``: the training episodes' return
and success per iteration, the warm start's BC and the control's longer BC per epoch."""

Suite = Literal["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"]


@dataclass
class LiberoTrainConfig(TrainConfig):
    """LIBERO main job: demos -> BC -> evaluate -> PPO fine-tuning -> evaluate, <= 15 min on 2 CPUs.

    One policy for every task of --suite (--task-id N: task N alone). --bc-control: the
    RL minutes go to a longer BC run instead; --from-scratch: PPO from a random policy.
    """

    # -- the main job (first in --help) ----------------------------------------------------
    suite: Suite = "libero_object"
    """LIBERO suite (the demos need a scripted expert for its tasks; --from-scratch runs
    on any suite)."""
    task_id: int | None = None
    """Train on this task of the suite alone (None: every task, one policy)."""
    task_ids: tuple[int, ...] = ()
    """Train one policy on these tasks of the suite; --task-id wins."""
    budget_minutes: float | None = 15.0
    """One deadline for the whole command (demos, BC, evaluations, training); None: the
    other limits (--total-timesteps, --max-minutes) alone."""
    bc_control: bool = False
    """Control run: demos, BC, evaluate, then the minutes RL would get go to a second,
    longer BC run (no early stop before the deadline), then evaluate; no RL."""
    from_scratch: bool = False
    """PPO from a random policy: no demos, no BC, no KL, no value warm-up."""
    task_one_hot: bool = False
    """Give the policy its task as a one-hot beside the goal features (the goal features
    already name the object to move and where; docs/trainer.md has both measured)."""
    demo_init_states: str | None = None
    """Init states of every task the expert demonstrates, one episode each ("0:2": ids 0
    and 1; "0,3,7" also works). Two per task leave BC room to improve: BC on 6 demos of
    each of the ten libero_object tasks already solved 0.96-0.98 of the held-out
    episodes, on 2 of each 0.70."""
    train_init_states: str | None = None
    """Init states of every task training episodes start from, at random; never an
    evaluation's."""
    eval_init_states: str | None = None
    """Init states of every task each evaluation plays, one deterministic episode each."""
    eval_during_init_states: int = 1
    """Init states of every task each evaluation during training plays: the first this
    many of --eval-init-states (1: one episode per task); 0: all of them. The
    evaluations before and after training play all."""
    demo_noise_std: float = 0.0
    """DART noise on xyz while collecting demos (0: clean demos, a middling BC policy)."""
    bc_max_epochs: int = 4000
    """Most BC epochs."""
    bc_patience: int = 400
    """BC stops after this many epochs without a better held-out action error."""
    bc_heldout: Literal["random", "last"] = "last"
    """Demos BC holds out to measure its action error: the last ones (with several tasks
    the last demo init state of every task; the same split for every --seed) or drawn
    with the seed."""

    # -- LIBERO env ------------------------------------------------------------------------
    env_id: str = "libero"
    """Label of the run (the envs come from --suite and --task-id)."""
    chunk_size: int = 1
    """Actions per policy decision (action chunk K), executed inside the env worker."""
    state_features: Literal["goal", "full", "both"] = "goal"
    """State observation: goal features (23 privileged values about the goal object and
    target), the full state vector, or both (see docs/libero.md)."""
    cameras: tuple[Literal["agentview", "wrist"], ...] = ()
    """Camera observations for the CNN (without: state only, ~10x faster on CPU)."""
    image_size: int = 128
    """Camera image side in pixels."""
    dense_reward: bool = True
    """Train on dense goal shaping (success is always logged from the sparse signal)."""
    shaping_scale: float = 1.0
    """Multiplier of the shaping term."""
    horizon: int | None = None
    """Primitive steps before truncation (None: the suite's evaluation horizon)."""
    train_horizon: int | None = 200
    """Primitive steps before a training episode truncates, at most --horizon (None:
    --horizon); evaluation episodes keep --horizon. A libero_object success takes about
    100-150 steps: failed training episodes end 80 steps sooner than the suite's 280,
    and the budget holds more episodes (docs/trainer_figures.md has the runs)."""

    # -- PPO, fine-tuning defaults ---------------------------------------------------------
    num_envs: int = 10
    num_stages: NumStages = 2
    envs_per_worker: int = 5
    num_steps: int = 64
    total_timesteps: int = 10_000_000
    """Primitive env steps to train for (across all envs); the default is beyond what
    --budget-minutes lets the run reach: the deadline ends training."""
    learning_rate: float = 1e-4
    anneal_lr: bool = False
    num_minibatches: int = 4
    update_epochs: int = 4
    target_kl: float | None = 0.02
    hidden_sizes: tuple[int, ...] = (128, 128)
    init_log_std: float = -0.5
    init_log_std_per_dim: tuple[float, ...] = (-3.0, -3.0, -3.0, -3.9, -3.9, -3.9, -3.9)
    explore_dims: tuple[int, ...] = (0, 1, 2)
    actor_learning_rate: float | None = 3e-5
    value_warmup_iterations: int = 10
    kl_coef: float = 1.0
    kl_decay: float = 1.0
    self_imitation_steps: int = 96
    freeze_obs_norm: bool = True
    eval_at_start: bool = True
    eval_every_minutes: float | None = 3.0
    max_minutes: float | None = None
    eval_episodes: tyro.conf.Suppress[int] = 50
    """Set from --eval-init-states (init states times tasks)."""
    video_fps: int = 20
    checkpoint_every: int = 20
    run_name: str | None = None
    """Run directory name under --run-dir."""
    resume: str | None = None
    """A --from-scratch run's checkpoint file or run directory to resume from (weights,
    optimiser, counters, RNG); it writes into that run directory."""

    def tasks(self) -> list[int]:
        """The run's task ids: [--task-id], or every task of --suite."""
        if self.task_id is not None:
            return [self.task_id]
        if self.task_ids:
            return [int(t) for t in self.task_ids]
        from pipelined_vec_env.libero import suites

        return list(range(suites.num_tasks(self.suite)))

    def init_states(self, which: Literal["demo", "train", "eval"]) -> tuple[int, ...]:
        """The init-state ids of every task for the demos, training or evaluation."""
        several = self.task_id is None and len(self.task_ids) != 1
        text = {
            "demo": self.demo_init_states or ("0:2" if several else "0:6"),
            "train": self.train_init_states or ("0:45" if several else "0:30"),
            "eval": self.eval_init_states or ("45:50" if several else "30:50"),
        }[which]
        return _ids(text)


JOB_FLAGS = (
    "suite",
    "task_id",
    "task_ids",
    "budget_minutes",
    "from_scratch",
    "bc_control",
    "seed",
    "task_one_hot",
    "run_dir",
    "run_name",
)
"""The job's own flags, first in ``--help`` (the "options" box)."""

GROUPS = (
    Group(
        "init_states",
        "Which of each task's 50 init states the demos, training and evaluation use "
        '("a:b": ids a to b-1; "0,3,7"); the evaluation\'s are never a demo\'s or training\'s.',
        ("demo_init_states", "train_init_states", "eval_init_states"),
    ),
    Group(
        "demos_and_bc",
        "The warm start: the scripted expert's demos and behaviour cloning of the actor.",
        ("demo_noise_std", "bc_max_epochs", "bc_patience", "bc_heldout"),
    ),
    Group(
        "fine_tuning",
        "PPO from the BC weights (--from-scratch turns these off).",
        (
            "init_log_std_per_dim",
            "init_log_std",
            "explore_dims",
            "value_warmup_iterations",
            "actor_learning_rate",
            "kl_coef",
            "kl_decay",
            "kl_coef_min",
            "self_imitation_steps",
            "self_imitation_lr",
            "self_imitation_batch_size",
            "self_imitation_capacity",
            "self_imitation_per_env",
            "self_imitation_sign_dims",
            "freeze_obs_norm",
        ),
    ),
    Group(
        "evaluation",
        "Held-out evaluations: before RL, every few minutes, after.",
        (
            "eval_at_start",
            "eval_every_minutes",
            "eval_every",
            "eval_during_init_states",
            "eval_seed",
            "eval_video",
            "eval_video_s",
            "video_fps",
        ),
    ),
    Group(
        "libero_env",
        "The LIBERO envs: observations, reward, action chunks.",
        (
            "state_features",
            "dense_reward",
            "shaping_scale",
            "chunk_size",
            "horizon",
            "train_horizon",
            "cameras",
            "image_size",
            "env_id",
        ),
    ),
    Group(
        "ppo",
        "PPO (Schulman et al. 2017) and the network.",
        (
            "total_timesteps",
            "num_steps",
            "learning_rate",
            "anneal_lr",
            "gamma",
            "gae_lambda",
            "num_minibatches",
            "update_epochs",
            "norm_adv",
            "clip_coef",
            "clip_vloss",
            "ent_coef",
            "vf_coef",
            "max_grad_norm",
            "target_kl",
            "normalize_obs",
            "normalize_reward",
            "hidden_sizes",
        ),
    ),
    Group(
        "pipeline",
        "Vector env and pipeline: envs, stages, workers, fault tolerance, decoupled mode, Ray.",
        (
            "num_envs",
            "num_stages",
            "envs_per_worker",
            "tune_seconds",
            "pipelined",
            "stage_order",
            "cpu_affinity",
            "worker_nice",
            "max_restarts",
            "step_deadline",
            "decoupled",
            "num_actors",
            "rollout_queue_size",
            "max_wait",
            "backend",
            "ray_address",
            "ray_num_cpus",
        ),
    ),
    Group(
        "run",
        "Other limits, device, checkpoints, logging and profiling.",
        (
            "max_minutes",
            "stop_return",
            "device",
            "torch_threads",
            "checkpoint_every",
            "resume",
            "tensorboard",
            "progress",
            "profile",
        ),
    ),
)
"""The other boxes of ``--help``, in order."""

HINTS = {
    "suite": f"(default: libero_object; with an expert: {', '.join(EXPERT_SUITES)})",
    "task_ids": "(default: every task of --suite)",
    "demo_init_states": "(default: 0:2 with several tasks, 0:6 with --task-id)",
    "train_init_states": "(default: 0:45 with several tasks, 0:30 with --task-id)",
    "eval_init_states": "(default: 45:50 with several tasks, 5 per task; 30:50 with --task-id)",
    "cameras": "(default: no camera)",
    "self_imitation_sign_dims": "(default: none; every target is the action taken)",
    "init_log_std": "(default: -0.5; used only where --init-log-std-per-dim is empty, as "
    "with --from-scratch)",
    "run_name": "(default: suite, all tasks or taskN, mode, seed and process id, e.g. "
    "libero_object_all_finetune__s1__4242)",
}
"""Flags whose "(default: ...)" says what the script does rather than the field's value."""

HIDDEN = ("eval_episodes", "eval_during_episodes", "deadline", "init_checkpoint")
"""Fields the script sets itself: the episode counts (from --eval-init-states and
--eval-during-init-states), the deadline (from --budget-minutes) and the warm start's checkpoint (the BC run's)."""


def parse_args(args: list[str] | None = None) -> LiberoTrainConfig:
    """The job's config from the command line (None: ``sys.argv[1:]``), ``--help`` grouped.

    Raises:
        SystemExit: on ``--help`` or a bad flag.
    """
    cli = grouped_class(LiberoTrainConfig, JOB_FLAGS, GROUPS, hints=HINTS, hidden=HIDDEN)
    return parse_grouped(cli, args)


def _make_libero_env(
    suite: str,
    task_id: int,
    chunk_size: int,
    state_features: str,
    cameras: tuple[str, ...],
    image_size: int,
    reward_type: str,
    shaping_scale: float,
    horizon: int | None,
    render: bool,
    init_state_ids: tuple[int, ...],
    one_hot_tasks: tuple[int, ...] | None,
    train_horizon: int | None = None,
) -> gym.Env:
    from pipelined_vec_env.libero.env import LiberoEnv
    from pipelined_vec_env.wrappers.action_chunk import ActionChunk

    env: gym.Env = LiberoEnv(
        suite,
        task_id,
        cameras=cameras,
        image_size=image_size,
        reward_type=reward_type,
        shaping_scale=shaping_scale,
        horizon=horizon,
        state_features=state_features,
        render_mode="rgb_array" if render else None,
    )
    env = TaskInitStates(env, task_id, init_state_ids, train_horizon)
    if one_hot_tasks:
        env = TaskOneHot(env, one_hot_tasks)
    return ActionChunk(env, chunk_size) if chunk_size > 1 else env


def _ids(text: str) -> tuple[int, ...]:
    from pipelined_vec_env.libero.collect import parse_init_states

    return tuple(parse_init_states(text))


@dataclass
class LiberoEnvFactory:
    """The LIBERO part of the trainer: env ``i`` trains on task ``tasks[i % T]``;
    evaluation episode ``j`` plays task ``tasks[j % T]`` from the ``j // T``-th
    evaluation init state."""

    config: LiberoTrainConfig
    tasks: tuple[int, ...]
    steps_info_key: str | None = "chunk_steps_executed"

    @property
    def steps_per_decision(self) -> int:
        """Primitive steps per decision: the chunk length."""
        return self.config.chunk_size

    def env_fn(self, index: int, *, render: bool = False) -> Callable[[], gym.Env]:
        """Constructor of env ``index`` (training resets draw from --train-init-states)."""
        c = self.config
        return functools.partial(
            _make_libero_env,
            c.suite,
            self.tasks[index % len(self.tasks)],
            c.chunk_size,
            c.state_features,
            tuple(c.cameras),
            c.image_size,
            "dense" if c.dense_reward else "sparse",
            c.shaping_scale,
            c.horizon,
            render,
            c.init_states("train"),
            self.tasks if c.task_one_hot else None,
            c.train_horizon,
        )

    def eval_reset_options(self, episode: int) -> dict[str, Any] | None:
        """Episode ``j``: task ``tasks[j % T]``, init state ``j // T`` of --eval-init-states."""
        ids = self.config.init_states("eval")
        n = len(self.tasks)
        return {
            "task_id": self.tasks[episode % n],
            "init_state_id": ids[(episode // n) % len(ids)],
        }


def _fixed_stages(config: LiberoTrainConfig) -> int:
    """Stages of the vector envs outside training (demos, a checkpoint's evaluation):
    --num-stages, or 2 with "auto" (tune measures the training loop only)."""
    return config.num_stages if isinstance(config.num_stages, int) else 2


def _obs_keys(config: LiberoTrainConfig) -> tuple[str, ...]:
    keys = {"goal": ("goal_features",), "full": ("state",), "both": ("goal_features", "state")}
    one_hot = (TASK_ONE_HOT_KEY,) if config.task_one_hot else ()
    return keys[config.state_features] + one_hot


def _check_expert(config: LiberoTrainConfig, tasks: list[int]) -> None:
    """Raise ValueError naming --suite if a task of the run has no scripted expert (the
    demos need one; --from-scratch does not)."""
    if config.from_scratch:
        return
    try:
        for task in tasks:
            expert_for(config.suite, task)
    except ValueError as err:
        raise ValueError(
            f"--suite {config.suite}: the demos need a scripted expert ({err}); "
            "--from-scratch needs none"
        ) from None


def _check_init_states(config: LiberoTrainConfig) -> None:
    """Raise ValueError if an evaluation init state is also a demo's or training's."""
    eval_ids = set(config.init_states("eval"))
    for which in ("demo", "train"):
        overlap = eval_ids & set(config.init_states(which))
        if overlap:
            raise ValueError(
                f"--{which}-init-states and --eval-init-states share init states "
                f"{sorted(overlap)}; the evaluation must use init states no demo and no "
                "training episode uses"
            )


def _collect(config: LiberoTrainConfig, tasks: list[int], run_dir: Path) -> dict[str, Any]:
    """The expert's demos of every task, written to ``demos.hdf5``; their summary."""
    from pipelined_vec_env.libero.demos import write_demos
    from reference_trainer.libero_tasks import add_task_one_hot, collect_suite_demos

    t0 = time.perf_counter()
    ids = config.init_states("demo")
    logger.info(
        "collecting expert demos: %d tasks x %d init states (%s), one env per task",
        len(tasks),
        len(ids),
        f"{ids[0]}-{ids[-1]}",
    )
    demos = collect_suite_demos(
        config.suite,
        tasks,
        ids,
        noise_std=config.demo_noise_std,
        num_workers=_fixed_stages(config),
        seed=config.seed,
    )
    if config.task_one_hot:
        add_task_one_hot(demos, tasks)
    path = run_dir / "demos.hdf5"
    write_demos(path, demos)
    info = demos.attrs["collection"]
    wall_s = time.perf_counter() - t0
    logger.info(
        "%d demos (%d/%d expert successes) in %.0f s",
        len(demos),
        len(demos),
        info["attempts"],
        wall_s,
    )
    return {
        "path": str(path),
        "kept": len(demos),
        "expert_successes": info["successes"],
        "expert_successes_per_task": info["successes_per_task"],
        "attempts": info["attempts"],
        "steps": demos.num_samples,
        "noise_std": config.demo_noise_std,
        "wall_s": wall_s,
    }


def _clone(
    config: LiberoTrainConfig, run_dir: Path, name: str, **limits: Any
) -> tuple[dict[str, Any], list[list[float]]]:
    """BC of the actor on ``demos.hdf5`` into ``<name>.pt``; its metrics (with the
    checkpoint and wall time) and its curve (``[epoch, train_mse, heldout_mse]`` per epoch)."""
    from reference_trainer.bc import BCConfig, train_bc

    t0 = time.perf_counter()
    bc = train_bc(
        BCConfig(
            demos=str(run_dir / "demos.hdf5"),
            output=str(run_dir / f"{name}.pt"),
            obs_keys=_obs_keys(config),
            chunk_size=config.chunk_size,
            hidden_sizes=tuple(config.hidden_sizes),
            heldout=config.bc_heldout,
            seed=config.seed,
            torch_threads=1,
            **limits,
        )
    )
    metrics = {**bc.metrics, "checkpoint": bc.checkpoint, "wall_s": time.perf_counter() - t0}
    return metrics, [list(point) for point in bc.curve]


def _warm_start(config: LiberoTrainConfig, tasks: list[int], run_dir: Path) -> dict[str, Any]:
    """Collect the expert demos and clone them; return what the summary records."""
    demos = _collect(config, tasks, run_dir)
    bc, curve = _clone(
        config, run_dir, "bc", max_epochs=config.bc_max_epochs, patience=config.bc_patience
    )
    return {"demos": demos, "bc": bc, "bc_curve": curve}


logger = logging.getLogger("train_libero")


def _mode(config: LiberoTrainConfig) -> str:
    return "scratch" if config.from_scratch else "bc_control" if config.bc_control else "finetune"


def run(config: LiberoTrainConfig, started: float | None = None) -> dict[str, Any]:
    """Run the main job (or --from-scratch / --bc-control) and return its summary.

    ``started``: when the command began (seconds since the epoch; None: now). The
    deadline and ``total_wall_s`` count from it; `main` passes `STARTED_AT`, so the
    imports are inside the budget too.

    The run directory's ``train.log`` holds the whole job's log lines, from the first
    (demos, BC) to the closing report (a resumed run appends).

    Raises:
        ValueError: for evaluation init states that a demo or training uses, both
            --from-scratch and --bc-control, --resume without --from-scratch, or a
            --suite without a scripted expert (all before any worker starts).
        FileNotFoundError: if --resume points at no checkpoint.
    """
    start = time.time() if started is None else started
    load_start = os.getloadavg()
    if config.from_scratch and config.bc_control:
        raise ValueError("--from-scratch and --bc-control are exclusive")
    if config.resume and not config.from_scratch:
        raise ValueError(
            "--resume continues a --from-scratch run only: the fine-tuning recipe and "
            "--bc-control start a new run from new demos and BC (--init-checkpoint, which "
            "--resume excludes)"
        )
    _check_init_states(config)
    tasks = config.tasks()
    _check_expert(config, tasks)
    deadline = None if config.budget_minutes is None else start + 60 * config.budget_minutes
    if config.run_name is None:
        which = "all" if config.task_id is None else f"task{config.task_id}"
        name = f"{config.suite}_{which}_{_mode(config)}__s{config.seed}__{os.getpid()}"
        config = dataclasses.replace(config, run_name=name)
    config = eval_episode_counts(config, tasks)
    run_dir = run_directory(config)  # the directory train() writes into (a resumed run's)
    log_file = RunLog(run_dir / "train.log")  # the whole job's log; train() writes into it
    try:
        summary = _run(config, tasks, run_dir, deadline)
        summary = _finish(summary, config, tasks, run_dir, start, load_start)
    finally:
        log_file.close()
    summary["report"] = _report(summary)
    with open(run_dir / "train.log", "a", encoding="utf-8") as log:
        log.write(summary["report"] + "\n")  # the closing report, as printed
    return summary


def eval_episode_counts(config: LiberoTrainConfig, tasks: list[int]) -> LiberoTrainConfig:
    """The config with ``eval_episodes`` (every task times --eval-init-states) and
    ``eval_during_episodes`` (every task times --eval-during-init-states) set.

    Raises:
        ValueError: if --eval-during-init-states is negative or more than
            --eval-init-states has.
    """
    eval_ids = config.init_states("eval")
    if not 0 <= config.eval_during_init_states <= len(eval_ids):
        raise ValueError(
            f"--eval-during-init-states: expected 0 to {len(eval_ids)} (the number of "
            f"--eval-init-states), got {config.eval_during_init_states}"
        )
    return dataclasses.replace(
        config,
        eval_episodes=len(tasks) * len(eval_ids),
        eval_during_episodes=len(tasks) * config.eval_during_init_states,
    )


def _run(
    config: LiberoTrainConfig, tasks: list[int], run_dir: Path, deadline: float | None
) -> dict[str, Any]:
    """The job's steps: warm start (or none), then RL (or the longer BC)."""
    logger.info(
        "%s on %s %s, %s",
        "PPO from scratch"
        if config.from_scratch
        else "demos -> BC -> evaluate -> "
        + ("longer BC" if config.bc_control else "PPO fine-tuning")
        + " -> evaluate",
        config.suite,
        f"task {tasks[0]}" if len(tasks) == 1 else f"tasks {tasks[0]}-{tasks[-1]} (one policy)",
        "no time budget"
        if config.budget_minutes is None
        else f"all within {config.budget_minutes:g} min",
    )
    factory = LiberoEnvFactory(config, tuple(tasks))
    extra: dict[str, Any] = {}
    if config.from_scratch:
        config = dataclasses.replace(
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
    else:
        extra.update(_warm_start(config, tasks, run_dir))
        config = dataclasses.replace(config, init_checkpoint=extra["bc"]["checkpoint"])
    config = dataclasses.replace(config, deadline=deadline)
    if config.bc_control:
        summary = _bc_control(config, factory, run_dir)
    else:
        summary = train(config, factory)
    return {**summary, **extra}


def _finish(
    summary: dict[str, Any],
    config: LiberoTrainConfig,
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
            "mode": _mode(config),
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
    ordered["learning_curve"] = _plot_learning_curve(
        ordered, curves, run_dir / "learning_curve.png"
    )
    ordered["per_task_plot"] = _plot_per_task(ordered, run_dir / "per_task.png")
    ordered["curves"] = str(run_dir / "curves.json")
    (run_dir / "summary.json").write_text(json.dumps(ordered, indent=2, default=str))
    return ordered


def evaluate_checkpoint(
    config: LiberoTrainConfig,
    factory: LiberoEnvFactory,
    checkpoint: str,
    noise_seed: int | None = None,
    video: Path | None = None,
) -> dict[str, Any]:
    """Evaluate a BC or trainer checkpoint as the trainer does: ``config.eval_episodes``
    episodes of ``factory``'s evaluation init states on a 2-stage vector env's workers,
    then, with ``video``, record episode 0 into that mp4 as the trainer's final evaluation
    does (within what ``config.deadline`` leaves).

    The agent is built as the trainer builds it (`reference_trainer.train.build_agent`): a
    BC checkpoint gets ``--init-log-std-per-dim`` (the std RL starts from), a trainer
    checkpoint keeps the std it was trained to, and ``--explore-dims`` says which
    dimensions a sampled action perturbs.

    Args:
        config: the job's config (suite, tasks, features, init states, layout).
        factory: the env factory of ``config``.
        checkpoint: a ``bc.pt``, a trainer checkpoint or a run directory.
        noise_seed: None acts with the policy mean (the job's evaluations); an int samples
            actions as training does, the noise seeded with it.

    Returns:
        The evaluation's scalars (``success_rate``, ``return_mean``, ...), ``successes``
        (one bool per episode, episode ``j`` being task ``j % T``), ``wall_s`` (the
        workers' start and the video included: building LIBERO envs takes seconds),
        ``video`` (the mp4 written or None), ``video_s`` and ``checkpoint``.
    """
    import torch

    from reference_trainer.envs import make_vector_env
    from reference_trainer.rollout import RolloutCollector
    from reference_trainer.train import build_agent, record_video_by_deadline
    from reference_trainer.vector_eval import evaluate_on_vector_env

    device = torch.device("cpu")
    t0 = time.perf_counter()
    envs = make_vector_env(
        factory,
        config.num_envs,
        num_stages=_fixed_stages(config),
        envs_per_worker=config.envs_per_worker,
    )
    try:
        agent = build_agent(
            config,
            envs.single_observation_space,
            envs.single_action_space,
            device,
            checkpoint,
            keep_trained_std=True,
        )
        collector = RolloutCollector(
            envs,
            agent,
            config.num_steps,
            device,
            steps_info_key=factory.steps_info_key,
            steps_per_decision=factory.steps_per_decision,
        )
        result = evaluate_on_vector_env(
            collector, factory, config.eval_episodes, config.eval_seed, noise_seed=noise_seed
        )
    finally:
        envs.close()
    written, video_s = (
        (None, 0.0)
        if video is None
        else record_video_by_deadline(agent, factory, device, video, config)
    )
    return {
        "iteration": 0,
        "global_step": 0,
        **result.as_scalars(),
        "successes": [bool(v) for v in result.successes or []],
        "wall_s": time.perf_counter() - t0,
        "video": written,
        "video_s": video_s,
        "checkpoint": checkpoint,
    }


def _bc_control(
    config: LiberoTrainConfig, factory: LiberoEnvFactory, run_dir: Path
) -> dict[str, Any]:
    """Evaluate the BC policy, train BC again for the minutes RL would get (until
    ``config.deadline``, less the evaluation after it), evaluate (with the video the RL
    run's final evaluation records); the longer BC's per-epoch errors go to
    ``curves.json`` (``bc_long_curve``)."""
    t0 = time.time()
    deadline = config.deadline
    before = evaluate_checkpoint(config, factory, str(config.init_checkpoint))
    before["bc_minutes"] = 0.0
    # the evaluation after BC (its video included) is planned as the trainer plans its final one
    after_s = eval_estimate([before], int(before["episodes"]), config.num_envs, 0, None)
    after_s += video_estimate([before], config)
    left = 0.0 if deadline is None else deadline - time.time() - after_s - FINISH_MARGIN_S
    minutes = max(0.1, left / 60)
    bc, curve = _clone(
        config, run_dir, "bc_long", max_epochs=10**9, patience=10**9, max_minutes=minutes
    )
    video = run_dir / "videos" / "after.mp4" if config.eval_video else None
    after = evaluate_checkpoint(config, factory, bc["checkpoint"], video=video)
    after["label"] = "after longer BC"
    after["bc_minutes"] = minutes
    return {
        "eval_success_rate_initial": before["success_rate"],
        "eval_success_rate_final": after["success_rate"],
        "eval_episodes": int(after["episodes"]),
        "evaluations": [before, after],
        "final_eval": after,
        "bc_long_curve": curve,
        "bc_long": {**bc, "minutes": minutes},
        "global_step": 0,
        "wall_s": time.time() - t0,
    }


def _plot_learning_curve(summary: dict[str, Any], curves: dict[str, Any], path: Path) -> str | None:
    """Held-out success at every evaluation (the suite and each task) against env steps,
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
    ax_e.set_ylim(-0.05, 1.1)
    ax_e.set_ylabel("held-out success rate")
    ax_e.set_title(
        "evaluation: deterministic policy, init states no demo or training used", fontsize=9
    )
    ax_e.legend(loc="lower right", fontsize=8)
    if control:
        ax_e.set_xlabel("minutes of further BC")
        _plot_bc_curve(ax_t, curves.get("bc_long_curve") or [])
    else:
        curve = curves.get("success_curve") or []
        if curve:
            x, y = zip(*curve, strict=True)
            k = max(1, min(25, len(y) // 8))
            ax_t.plot(x[k - 1 :], np.convolve(np.asarray(y), np.ones(k) / k, "valid"), color="C1")
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
    evaluations (before, after) as filled circles joined by a line, with each task's rate
    in grey, the subsets during training as open diamonds off the line; the legend gives
    their episode counts."""
    full = [e for e in evaluations if not e.get("subset")]
    subset = [e for e in evaluations if e.get("subset")]
    per_task = [e.get("success_rate_per_task") for e in full]
    if full and all(per_task) and len(per_task[0]) > 1:
        for t in range(len(per_task[0])):
            ax.plot([e[x] for e in full], [p[t] for p in per_task], color="0.8", lw=1)
        ax.plot([], [], color="0.8", lw=1, label="each task (full evaluations)")
    # one line through the full evaluations only: a subset of 10 episodes moves 0.1 per
    # episode, so its points stand on their own, not on the suite's line
    ax.plot(
        [e[x] for e in full],
        [e["success_rate"] for e in full],
        "-",
        color="C0",
        lw=2.5,
        zorder=2,
    )
    for group, marker, face, when in (
        (full, "o", "C0", "before, after"),
        (subset, "D", "white", "during training"),
    ):
        if not group:
            continue
        episodes = sorted({int(e["episodes"]) for e in group})
        states = max(len(e.get("init_states") or ()) for e in group)
        ax.plot(
            [e[x] for e in group],
            [e["success_rate"] for e in group],
            marker,
            color="C0",
            markerfacecolor=face,
            markeredgewidth=2,
            markersize=8,
            zorder=3,
            label=f"suite mean, {when}: {'/'.join(map(str, episodes))} held-out episodes"
            + (f" ({states} init state{'s' * (states != 1)} per task)" if states else ""),
        )
    for e in evaluations:  # a subset's value below its marker, off a full one's
        ax.annotate(
            f"{e['success_rate']:.2f}",
            (e[x], e["success_rate"]),
            xytext=(0, -16 if e.get("subset") else 8),
            textcoords="offset points",
            ha="center",
            fontsize=9,
        )


def _plot_per_task(summary: dict[str, Any], path: Path) -> str | None:
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
    after_label = "after longer BC" if summary["mode"] == "bc_control" else "after RL"
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
        label=f"{after_label}: suite {summary['eval_success_rate_final']:.2f}",
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


def _report(summary: dict[str, Any]) -> str:
    """The closing report: success before and after, per task, steps, time, files."""

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    label = "after longer BC" if summary["mode"] == "bc_control" else "after RL"
    lines = [
        "",
        f"run directory: {summary['run_dir']} ({summary['mode']})",
        f"success rate:  {fmt(summary['eval_success_rate_initial'])} before -> "
        f"{fmt(summary['eval_success_rate_final'])} {label} "
        f"({summary['eval_episodes']} deterministic episodes on held-out init states)",
    ]
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
    if videos:
        lines.append(f"videos:        {', '.join(videos)}")
    pictures = [p for p in (summary.get("learning_curve"), summary.get("per_task_plot")) if p]
    lines.append(f"pictures:      {', '.join(pictures)}")
    lines.append(json.dumps({"summary": os.path.join(summary["run_dir"], "summary.json")}))
    return "\n".join(lines)


def main() -> None:
    """Parse the config, run the main job, print success before and after."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    # PyOpenGL logs "OpenGL_accelerate module loaded" at INFO when the video renderer starts
    logging.getLogger("OpenGL").setLevel(logging.WARNING)
    config = parse_args()
    if config.eval_video or config.cameras:
        # headless rendering; an explicit MUJOCO_GL (e.g. osmesa) wins
        os.environ.setdefault("MUJOCO_GL", "egl")
    print(run(config, started=STARTED_AT)["report"])


if __name__ == "__main__":
    main()
