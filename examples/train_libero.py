"""The main job: PPO fine-tuning of one behaviour-cloned policy on a whole LIBERO suite.

With no arguments: the ten libero_object tasks, one policy, the whole command within
``--budget-minutes`` 15, in three phases (`run`): 1. the warm start: a scripted expert's
demos, behaviour cloning (BC) of the actor; 2. fine-tuning (`reference_trainer.train`):
evaluate the BC policy on held-out init states, PPO from its weights, evaluate again, a
video; 3. the report: summary.json, curves.json, learning_curve.png, per_task.png.
``--bc-control`` gives the RL minutes to a longer BC run instead; ``--from-scratch`` is
PPO from a random policy; ``--help`` lists the flags; the README every file written.
"""

# ruff: noqa: E402 - the clock below starts before the heavy imports
from __future__ import annotations

import time

# --budget-minutes counts from here, the imports included: not from the process's start
# (`bash -c 'bash scripts/install.sh && python examples/train_libero.py'` would count the install)
STARTED_AT = time.time()

import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import tyro

from reference_trainer.bc_control import bc_control
from reference_trainer.config import TrainConfig
from reference_trainer.init_states import DEFAULT_INIT_STATES, parse_ids
from reference_trainer.job_report import write_report, write_summary
from reference_trainer.libero_tasks import make_libero_env
from reference_trainer.main_job import (
    check_job,
    describe_job,
    job_config,
    job_progress,
    scratch_recipe,
)
from reference_trainer.main_job_cli import parse_job_args
from reference_trainer.run_log import LOG_FORMAT, RunLog
from reference_trainer.train import run_directory, train
from reference_trainer.warm_start import warm_start

logger = logging.getLogger("train_libero")


@dataclass
class LiberoTrainConfig(TrainConfig):
    """LIBERO main job: demos -> BC -> evaluate -> PPO fine-tuning -> evaluate, <= 15 min on 2 CPUs.

    One policy for every task of --suite (--task-id N: task N alone). --bc-control: the
    RL minutes go to a longer BC run instead; --from-scratch: PPO from a random policy.
    """

    # -- the main job (first in --help) ----------------------------------------------------
    suite: Literal["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"] = (
        "libero_object"
    )
    """LIBERO suite (the demos need a scripted expert; --from-scratch runs on any)."""
    task_id: int | None = None
    """Train on this task of the suite alone (None: every task, one policy)."""
    task_ids: tuple[int, ...] = ()
    """Train one policy on these tasks of the suite; --task-id wins."""
    budget_minutes: float | None = 15.0
    """One deadline for the whole command (demos, BC, evaluations, training); None: the
    other limits (--total-timesteps, --max-minutes) alone."""
    bc_control: bool = False
    """Control run: the minutes RL would get go to a second, longer BC run; no RL."""
    from_scratch: bool = False
    """PPO from a random policy: no demos, no BC, no KL, no value warm-up."""
    task_one_hot: bool = False
    """Give the policy its task as a one-hot beside the goal features (which already name
    the object to move and where; docs/trainer.md has both measured)."""

    # -- init states, demos and BC ---------------------------------------------------------
    demo_init_states: str | None = None
    """Init states of every task the expert demonstrates, one episode each ("0:2": ids 0
    and 1; "0,3,7" also works)."""
    train_init_states: str | None = None
    """Init states of every task training episodes start from, at random."""
    eval_init_states: str | None = None
    """Init states of every task each evaluation plays, one deterministic episode each."""
    eval_during_init_states: int = 1
    """Init states of every task each evaluation during training plays: the first this
    many of --eval-init-states; 0: all (the evaluations before and after play all)."""
    demo_noise_std: float = 0.0
    """DART noise on xyz while collecting demos (0: clean demos, a middling BC policy)."""
    bc_max_epochs: int = 4000
    """Most BC epochs."""
    bc_patience: int = 400
    """BC stops after this many epochs without a better held-out action error."""
    bc_heldout: Literal["random", "last"] = "last"
    """Demos BC holds out to measure its action error: the last (with several tasks the
    last demo init state of every task) or drawn with the seed."""

    # -- LIBERO env ------------------------------------------------------------------------
    env_id: str = "libero"
    """Label of the run (the envs come from --suite and --task-id)."""
    chunk_size: int = 1
    """Actions per policy decision (action chunk K), executed inside the env worker."""
    state_features: Literal["goal", "full", "both"] = "goal"
    """State observation: goal features (23 privileged values about the goal object and
    target), the full state vector, or both (docs/libero.md)."""
    cameras: tuple[Literal["agentview", "wrist"], ...] = ()
    """Camera observations for the CNN (without: state only, ~10x faster on CPU)."""
    image_size: int = 128
    """Camera image side in pixels."""
    video_size: int = 256
    """Side of the video's frames in pixels (with --cameras: --image-size, what the
    policy sees)."""
    dense_reward: bool = True
    """Train on dense goal shaping (success is always logged from the sparse signal)."""
    shaping_scale: float = 1.0
    """Multiplier of the shaping term."""
    horizon: int | None = None
    """Primitive steps before truncation (None: the suite's evaluation horizon)."""
    train_horizon: int | None = 200
    """Primitive steps before a training episode truncates, at most --horizon (None:
    --horizon); evaluation episodes keep --horizon (a success takes 100-150 steps)."""

    # -- PPO, fine-tuning defaults ---------------------------------------------------------
    num_envs: int = 10
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
    self_imitation_steps: int = 96
    freeze_obs_norm: bool = True
    eval_at_start: bool = True
    eval_every_minutes: float | None = 3.0
    eval_episodes: tyro.conf.Suppress[int] = 50
    """Set from --eval-init-states (init states times tasks)."""
    checkpoint_every: int = 20
    run_name: str | None = None
    """Run directory name under --run-dir."""
    resume: str | None = None
    """A --from-scratch run's checkpoint or run directory to resume (it writes there)."""

    def tasks(self) -> list[int]:
        """The run's task ids: [--task-id], --task-ids, or every task of --suite."""
        if self.task_id is not None:
            return [self.task_id]
        if self.task_ids:
            return [int(t) for t in self.task_ids]
        from pipelined_vec_env.libero import suites

        return list(range(suites.num_tasks(self.suite)))

    def init_states(self, which: Literal["demo", "train", "eval"]) -> tuple[int, ...]:
        """The init-state ids of every task for the demos, training or evaluation."""
        several = self.task_id is None and len(self.task_ids) != 1
        given = getattr(self, f"{which}_init_states")  # --demo-init-states etc.
        return parse_ids(given or DEFAULT_INIT_STATES[several][which])


def parse_args(args: list[str] | None = None) -> LiberoTrainConfig:
    """The config from the command line (None: ``sys.argv[1:]``); ``--help`` shows the job's
    flags first, then the others by group (`reference_trainer.main_job_cli`)."""
    return parse_job_args(LiberoTrainConfig, args)


@dataclass
class LiberoEnvFactory:
    """The LIBERO envs of the run: env ``i`` trains on task ``tasks[i % T]``; evaluation
    episode ``j`` plays task ``tasks[j % T]`` from the ``j // T``-th evaluation init state."""

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
            make_libero_env,
            c.suite,
            self.tasks[index % len(self.tasks)],
            c.chunk_size,
            c.state_features,
            tuple(c.cameras),
            c.video_size if render and not c.cameras else c.image_size,
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
        ids, n = self.config.init_states("eval"), len(self.tasks)
        return {"task_id": self.tasks[episode % n], "init_state_id": ids[(episode // n) % len(ids)]}


def run(config: LiberoTrainConfig, started: float | None = None) -> dict[str, Any]:
    """Run the main job (or --from-scratch / --bc-control) and return its summary; the
    deadline counts from ``started`` (seconds since the epoch; None: now).

    Raises:
        ValueError: for flags that do not go together (`check_job`), before any worker.
        FileNotFoundError: if --resume points at no checkpoint.
    """
    started = time.time() if started is None else started
    load_start = os.getloadavg()
    tasks = config.tasks()
    check_job(config, tasks)
    config = job_config(config, tasks, started)  # run name, deadline, evaluation sizes
    run_dir = run_directory(config)
    log = RunLog(run_dir / "train.log")  # the whole job's log; train() writes into it too
    progress = job_progress(config, started)  # one bar for the whole job
    try:
        logger.info(describe_job(config, tasks))
        factory = LiberoEnvFactory(config, tuple(tasks))
        warm: dict[str, Any] = {}
        if config.from_scratch:
            config = scratch_recipe(config)
        else:
            # 1. warm start: the expert's demos, behaviour cloning of the actor
            progress.describe("demos and BC")
            warm = warm_start(config, tasks, run_dir)
            config = dataclasses.replace(config, init_checkpoint=warm["bc"]["checkpoint"])
        if config.bc_control:
            # 2'. the control: evaluate, a longer BC for the minutes RL would get, evaluate
            summary = bc_control(config, factory, run_dir, progress)
        else:
            # 2. fine-tuning: evaluate, PPO from the BC weights, evaluate, video
            summary = train(config, factory, progress=progress)
        # 3. report: summary.json (the summary first), curves.json, the pictures
        summary = write_summary({**summary, **warm}, config, tasks, run_dir, started, load_start)
        progress.close("done")
    finally:
        progress.close()
        log.close()
    summary["report"] = write_report(summary, run_dir / "train.log")
    return summary


def main() -> None:
    """Parse the config, run the main job, print success before and after."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    # PyOpenGL logs "OpenGL_accelerate module loaded" at INFO when the video renderer starts
    logging.getLogger("OpenGL").setLevel(logging.WARNING)
    config = parse_args()
    if config.eval_video or config.cameras:
        os.environ.setdefault("MUJOCO_GL", "egl")  # headless; an explicit MUJOCO_GL wins
    print(run(config, started=STARTED_AT)["report"])


if __name__ == "__main__":
    main()
