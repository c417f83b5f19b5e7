"""The main job's command line (``examples/train_libero.py``): its own flags first in
``--help``, then the trainer's and the recipe's in named boxes (`reference_trainer.cli`).

The boxes name the fields of the job's config (a `TrainConfig` with the LIBERO job's
fields); `parse_job_args` refuses a field in no box.
"""

from __future__ import annotations

from typing import TypeVar

from reference_trainer.cli import Group, grouped_class, parse_grouped
from reference_trainer.libero_tasks import EXPERT_SUITES

__all__ = ["GROUPS", "HIDDEN", "HINTS", "JOB_FLAGS", "parse_job_args"]

T = TypeVar("T")

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
            "video_size",
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


def parse_job_args(config_class: type[T], args: list[str] | None = None) -> T:
    """The job's config from the command line (None: ``sys.argv[1:]``), ``--help`` grouped.

    Raises:
        SystemExit: on ``--help`` or a bad flag.
        ValueError: if a field of ``config_class`` is in no box.
    """
    cli = grouped_class(config_class, JOB_FLAGS, GROUPS, hints=HINTS, hidden=HIDDEN)
    return parse_grouped(cli, args)
