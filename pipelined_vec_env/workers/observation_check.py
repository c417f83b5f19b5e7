"""Which part of an observation does not fit its space, once a write into the shared
buffers failed (`worker_envs.WorkerEnvs`): the innermost key, what the space wants there
and what the env returned. Only the failure path runs it, so fitting observations cost
nothing more.

What fits is what gymnasium's shared memory writes accept: every key of a Dict space and
every item of a Tuple space present (extra dict keys are ignored, as gymnasium's
``SyncVectorEnv`` ignores them), each leaf of its space's shape, in a dtype numpy can cast
to the space's (``np.asarray(value, dtype)``, unsafe casting, as gymnasium's shared memory
writes and so ``AsyncVectorEnv`` cast: a float frame into a uint8 space is truncated;
``SyncVectorEnv`` refuses casts that are not ``same_kind``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from ..errors import ObservationError

__all__ = ["find_mismatch", "observation_error", "without_envs"]


def _describe_space(space: spaces.Space) -> str:
    if isinstance(space, spaces.Dict):
        return f"a dict with keys {list(space.spaces)}"
    if isinstance(space, spaces.Tuple):
        return f"a tuple of {len(space.spaces)} items"
    shape = getattr(space, "shape", None)
    return f"shape {shape} {space.dtype}" if shape is not None else repr(space)


def _describe_value(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"a dict with keys {list(value)}"
    try:
        array = np.asarray(value)
    except Exception:
        return f"a {type(value).__name__}"
    if array.dtype == object:
        return f"a {type(value).__name__}"
    return f"shape {array.shape} {array.dtype}"


def find_mismatch(
    space: spaces.Space, value: Any, path: str = "observation"
) -> tuple[str, str, str] | None:
    """``(key, expected, received)`` of the innermost part of ``value`` that does not fit
    ``space``, or None when it all fits.

    Examples:
        >>> space = spaces.Dict({"image": spaces.Box(0, 255, (2, 2, 3), np.uint8)})
        >>> find_mismatch(space, {"image": np.zeros((2, 2, 4), np.uint8)})
        ("observation['image']", 'shape (2, 2, 3) uint8', 'shape (2, 2, 4) uint8')
    """
    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping):
            return path, _describe_space(space), _describe_value(value)
        for key, subspace in space.spaces.items():
            where = f"{path}[{key!r}]"
            if key not in value:
                return where, _describe_space(subspace), f"no such key (keys: {list(value)})"
            found = find_mismatch(subspace, value[key], where)
            if found is not None:
                return found
        return None
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, Sequence) or len(value) != len(space.spaces):
            return path, _describe_space(space), _describe_value(value)
        for i, (subspace, item) in enumerate(zip(space.spaces, value, strict=True)):
            found = find_mismatch(subspace, item, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    shape = getattr(space, "shape", None)
    try:
        array = np.asarray(value)
        if space.dtype is not None:
            array.astype(space.dtype)  # what the write does (unsafe casting)
    except Exception:
        return path, _describe_space(space), _describe_value(value)
    if shape is not None and array.shape != tuple(shape):
        return path, _describe_space(space), _describe_value(value)
    return None


def observation_error(
    space: spaces.Space,
    failed: list[tuple[int, Any, BaseException]],
    worker_results: Any,
) -> ObservationError:
    """The `ObservationError` for the envs ``failed`` (``(global index, observation, the
    write's exception)``, in env order) of a worker whose other envs' results are
    ``worker_results``."""
    env_index, value, exc = failed[0]
    found = find_mismatch(space, value)
    if found is None:  # nothing found: the write's own words
        found = ("observation", _describe_space(space), f"{_describe_value(value)} ({exc})")
    key, expected, received = found
    return ObservationError(
        env_index, key, expected, received, tuple(g for g, _, _ in failed), worker_results
    )


def without_envs(results: tuple, positions: list[int]) -> tuple:
    """A step's ``(items, rewards, terminations, truncations, infos)`` or a reset's
    ``(items, infos)`` answer payload with the envs at ``positions`` (answer order) blanked:
    reward 0, flags False, no infos (what ``partial_results`` shows for a failed env)."""
    infos = [[] if k in positions else env_infos for k, env_infos in enumerate(results[-1])]
    if len(results) == 2:
        return results[0], infos
    items, rewards, terminations, truncations, _ = results
    rewards, terminations, truncations = rewards.copy(), terminations.copy(), truncations.copy()
    rewards[positions], terminations[positions], truncations[positions] = 0.0, False, False
    return items, rewards, terminations, truncations, infos
