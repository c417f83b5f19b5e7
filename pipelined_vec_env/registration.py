"""``gymnasium.make_vec``-style construction of [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv].

Two ways in:

- [`make_vec`][pipelined_vec_env.make_vec] mirrors `gymnasium.make_vec` (same ``id``, ``num_envs``,
  ``vector_kwargs``, ``wrappers`` and env ``**kwargs``) plus ``num_stages`` and
  ``envs_per_worker``, and always returns a [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv].
- [`register`][pipelined_vec_env.register] registers an id with gymnasium whose ``vector_entry_point`` builds a
  [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv], so `gymnasium.make_vec` itself returns one.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import gymnasium as gym
from gymnasium import Env, Wrapper
from gymnasium.envs.registration import EnvSpec

from .vector_env import PipelinedVectorEnv

__all__ = ["make_vec", "register", "vector_entry_point"]

_VECTOR_ARGS = frozenset(inspect.signature(PipelinedVectorEnv.__init__).parameters) - {
    "self",
    "env_fns",
}


def _make_single(
    spec: EnvSpec, kwargs: dict[str, Any], wrappers: Sequence[Callable[[Env], Wrapper]]
) -> Env:
    env = gym.make(spec, **copy.deepcopy(kwargs))
    for wrapper in wrappers:
        env = wrapper(env)
    return env


def make_vec(
    id: str | EnvSpec,
    num_envs: int = 1,
    *,
    num_stages: int = 1,
    envs_per_worker: int | None = None,
    start_timeout: float = 300.0,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[Env], Wrapper]] | None = None,
    profile: bool = False,
    **kwargs: Any,
) -> PipelinedVectorEnv:
    """Create a [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] of ``num_envs`` copies of a registered env.

    Examples:
        >>> import pipelined_vec_env
        >>> envs = pipelined_vec_env.make_vec("CartPole-v1", 4, num_stages=2)
        >>> envs.stage_slices
        (slice(0, 2, None), slice(2, 4, None))
        >>> envs.close()

    Args:
        id: A registered env id (``"module:Env-v0"`` works) or an `EnvSpec`; the
            ``spec`` of a vector env made here recreates it.
        num_envs: Number of envs.
        num_stages: Pipeline stages (see [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv]).
        envs_per_worker: Envs per worker process; default None: one worker per usable
            core per stage (see `PipelinedVectorEnv`).
        start_timeout: Seconds each worker may take to start and build its envs (see
            [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv]); a vector
            argument, never passed to `gymnasium.make`.
        vector_kwargs: Other [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] keyword arguments
            (``autoreset_mode``, ``context``, ``cpu_affinity`` ...).
        wrappers: Wrapper constructors applied, in order, to each env inside its worker.
        profile: Record a profile in ``envs.profiler`` (see `PipelinedVectorEnv`); not
            passed to `gymnasium.make`.
        **kwargs: Passed to `gymnasium.make` for each env.

    Returns:
        The vector env; its ``spec`` holds the arguments needed to rebuild it.

    Raises:
        gymnasium.error.Error: Unknown id.
        ValueError: Bad vector arguments (before any worker starts).
    """
    spec = copy.deepcopy(id if isinstance(id, EnvSpec) else gym.spec(id))
    env_kwargs = dict(spec.kwargs)
    spec.kwargs = {}
    num_envs = env_kwargs.pop("num_envs", num_envs)
    saved_vector = env_kwargs.pop("vector_kwargs", {}) or {}
    wrappers = list(env_kwargs.pop("wrappers", wrappers) or [])
    env_kwargs.pop("vectorization_mode", None)
    env_kwargs.update(kwargs)
    vector = {**saved_vector, **(vector_kwargs or {})}
    vector.setdefault("num_stages", num_stages)
    vector.setdefault("envs_per_worker", envs_per_worker)
    vector.setdefault("start_timeout", start_timeout)
    if profile:
        vector["profile"] = True
    unknown = set(vector) - _VECTOR_ARGS
    if unknown:
        raise ValueError(f"vector_kwargs: unknown PipelinedVectorEnv arguments {sorted(unknown)}")
    single = partial(_make_single, spec, env_kwargs, wrappers)
    envs = PipelinedVectorEnv([single] * num_envs, **vector)
    rebuilt = copy.deepcopy(spec)
    rebuilt.kwargs = {**env_kwargs, "num_envs": num_envs, "vector_kwargs": vector}
    if wrappers:
        rebuilt.kwargs["wrappers"] = wrappers
    envs.spec = rebuilt
    return envs


def vector_entry_point(env_id: str, num_envs: int = 1, **kwargs: Any) -> PipelinedVectorEnv:
    """Build a [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] for ``gymnasium.make_vec``'s ``vector_entry_point``.

    Keyword arguments named like [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] parameters (``num_stages``,
    ``envs_per_worker``, ``autoreset_mode`` ...) configure the vector env; the rest go to
    each env's `gymnasium.make`. Bind ``env_id`` with `functools.partial`, or
    use [`register`][pipelined_vec_env.register].
    """
    vector = {k: kwargs.pop(k) for k in list(kwargs) if k in _VECTOR_ARGS}
    spec = copy.deepcopy(gym.spec(env_id))
    return make_vec(spec, num_envs, vector_kwargs=vector, **kwargs)


def register(id: str, entry_point: Any, **register_kwargs: Any) -> None:
    """Register ``id`` with gymnasium so that ``gymnasium.make_vec(id, n)`` returns a
    [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] (and ``gymnasium.make(id)`` one env, as usual).

    Examples:
        >>> import gymnasium as gym
        >>> import pipelined_vec_env
        >>> pipelined_vec_env.register(
        ...     "PipelinedCartPole-v1",
        ...     entry_point=gym.spec("CartPole-v1").entry_point,
        ...     max_episode_steps=500,
        ... )
        >>> envs = gym.make_vec("PipelinedCartPole-v1", num_envs=4, num_stages=2)
        >>> type(envs).__name__, envs.num_stages
        ('PipelinedVectorEnv', 2)
        >>> envs.close()

    Args:
        id: The new env id.
        entry_point: The single env's entry point (class, callable or ``"module:Class"``).
        **register_kwargs: Passed to `gymnasium.register` (``max_episode_steps``,
            ``kwargs`` ...).
    """
    gym.register(
        id,
        entry_point=entry_point,
        vector_entry_point=partial(vector_entry_point, id),
        **register_kwargs,
    )
