"""Env factories: the only env-specific part of the trainer.

A factory builds single envs (in worker processes for training, in-process for
evaluation) and says how to read them: how many primitive steps one decision is (action
chunks) and which reset options give evaluation episode ``j`` its fixed initial state.
``GymEnvFactory`` covers any registered gymnasium id; ``examples/train_libero.py`` has the
LIBERO one.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from reference_trainer.scheduled_resets import ScheduledResetsFn

if not os.environ.get("DISPLAY"):
    # headless: MuJoCo's default GLFW backend needs a display; EGL renders offscreen
    # (evaluation videos). Set before any env imports mujoco, so workers inherit it.
    os.environ.setdefault("MUJOCO_GL", "egl")

__all__ = ["EnvFactory", "GymEnvFactory", "make_vector_env", "num_env_workers"]


class EnvFactory(Protocol):
    """What the trainer needs to know about an env.

    Attributes:
        steps_per_decision: primitive env steps per policy decision (chunk length ``K``).
        steps_info_key: info key with the primitive steps a decision actually executed
            (a chunk cut short by the episode's end), or None.
    """

    steps_per_decision: int
    steps_info_key: str | None

    def env_fn(self, index: int, *, render: bool = False) -> Callable[[], gym.Env]:
        """A picklable constructor of env ``index``; ``render`` asks for ``rgb_array`` frames."""
        ...

    def eval_reset_options(self, episode: int) -> dict[str, Any] | None:
        """Reset options that give evaluation episode ``episode`` its fixed initial state."""
        ...


def _make_gym_env(env_id: str, kwargs: dict[str, Any], render: bool) -> gym.Env:
    if render:
        return gym.make(env_id, render_mode="rgb_array", **kwargs)
    return gym.make(env_id, **kwargs)


@dataclass
class GymEnvFactory:
    """Factory for a registered gymnasium id (one action per decision).

    Args:
        env_id: the gymnasium id, e.g. ``"InvertedPendulum-v5"``.
        kwargs: keyword arguments for ``gymnasium.make``.
    """

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    steps_per_decision: int = 1
    steps_info_key: str | None = None

    def env_fn(self, index: int, *, render: bool = False) -> Callable[[], gym.Env]:
        """Constructor for env ``index`` (the index does not change the env)."""
        return functools.partial(_make_gym_env, self.env_id, dict(self.kwargs), render)

    def eval_reset_options(self, episode: int) -> dict[str, Any] | None:
        """No options: the evaluation seed alone fixes the initial state."""
        return None


def num_env_workers(num_envs: int, num_stages: int, envs_per_worker: int | None) -> int:
    """Worker processes ``PipelinedVectorEnv`` starts for this layout.

    Args:
        num_envs: total envs.
        num_stages: pipeline stages (envs split like ``np.array_split``).
        envs_per_worker: envs per worker within a stage; None: the default of
            ``PipelinedVectorEnv`` (about one worker per usable core in each stage).

    Returns:
        The sum over stages of ``ceil(stage_size / envs_per_worker)``.
    """
    if envs_per_worker is None:
        from pipelined_vec_env import default_envs_per_worker

        envs_per_worker = default_envs_per_worker(num_envs, num_stages)
    base, extra = divmod(num_envs, num_stages)
    sizes = [base + (1 if s < extra else 0) for s in range(num_stages)]
    return sum(math.ceil(size / envs_per_worker) for size in sizes if size)


def make_vector_env(
    factory: EnvFactory,
    num_envs: int,
    *,
    num_stages: int,
    envs_per_worker: int | None = None,
    cpu_affinity: str | None = None,
    worker_nice: int | str | None = None,
    max_restarts: int = 0,
    step_deadline: float | None = None,
    backend: str = "multiprocessing",
    ray_options: dict[str, Any] | None = None,
    profile: bool = False,
) -> gym.vector.VectorEnv:
    """Build the staged training vector env in SAME_STEP autoreset mode.

    Every env is wrapped in `reference_trainer.scheduled_resets.ScheduledResets`, so that
    evaluations can run on these envs from fixed initial states.

    Args:
        factory: the env factory.
        num_envs: number of envs.
        num_stages: pipeline stages.
        envs_per_worker: envs per worker process; None: one worker per usable core per
            stage.
        cpu_affinity: None or ``"auto"`` (passed to ``PipelinedVectorEnv``).
        worker_nice: nice value of the env workers, or None for the env's default
            (``PipelinedVectorEnv(worker_nice=...)``).
        max_restarts: restarts allowed per worker (passed to ``PipelinedVectorEnv``).
        step_deadline: seconds per worker step before it is killed (passed on too).
        backend: ``"multiprocessing"`` or ``"ray"`` (passed to ``PipelinedVectorEnv``).
        ray_options: With ``backend="ray"``: actor placement (see ``RayOptions``).
        profile: record a profile in ``envs.profiler`` (passed to ``PipelinedVectorEnv``).

    Returns:
        A ``pipelined_vec_env.PipelinedVectorEnv``.

    Raises:
        ValueError: if ``num_stages`` is not in ``[1, num_envs]``.
    """
    from pipelined_vec_env import PipelinedVectorEnv

    if not 1 <= num_stages <= num_envs:
        raise ValueError(f"num_stages must be in [1, num_envs={num_envs}], got {num_stages}")
    return PipelinedVectorEnv(
        [ScheduledResetsFn(factory.env_fn(i)) for i in range(num_envs)],
        num_stages=num_stages,
        envs_per_worker=envs_per_worker,
        autoreset_mode=AutoresetMode.SAME_STEP,
        cpu_affinity=cpu_affinity,
        max_restarts=max_restarts,
        step_deadline=step_deadline,
        backend=backend,
        ray_options=ray_options,
        profile=profile,
        **({} if worker_nice is None else {"worker_nice": worker_nice}),
    )
