"""Per-space helpers for batches: slicing, joining and stacking batches; converting and
checking actions.

Batches follow gymnasium's layout (`gymnasium.vector.utils.batch_space`): a Box,
Discrete, MultiDiscrete or MultiBinary batch is one array whose first axis is the env; a
Dict batch is a dict of batches; a Tuple batch is a tuple of batches; other spaces (Text,
Graph, Sequence, OneOf) batch as a tuple with one item per env.
"""

from __future__ import annotations

import itertools
from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = [
    "batch_slice",
    "leaves",
    "check_actions",
    "concat_batches",
    "stack_batches",
    "swap_leading_axes",
    "to_numpy",
]


def leaves(batch: Any) -> list[np.ndarray]:
    """The arrays of a batch in gymnasium's layout (a dict's in key order, a tuple's in
    order), depth first."""
    if isinstance(batch, dict):
        return [a for value in batch.values() for a in leaves(value)]
    if isinstance(batch, tuple):
        return [a for value in batch for a in leaves(value)]
    return [batch]


@singledispatch
def batch_slice(space: spaces.Space, batch: Any, index: slice | np.ndarray) -> Any:
    """Return the part of ``batch`` that belongs to the envs ``index``.

    Args:
        space: The single-env space the batch was built from.
        batch: A batch of ``n`` items in gymnasium's batched layout.
        index: A slice, or an integer array, of env positions in ``[0, n)``.

    Returns:
        A batch of the selected envs in the same layout. With a slice, arrays are views;
        with an array of positions, copies.
    """
    if isinstance(batch, tuple) and not isinstance(index, slice):
        return tuple(batch[int(i)] for i in index)
    return batch[index]


@batch_slice.register(spaces.Dict)
def _(space: spaces.Dict, batch: dict[str, Any], index: slice | np.ndarray) -> dict[str, Any]:
    return {key: batch_slice(sub, batch[key], index) for key, sub in space.spaces.items()}


@batch_slice.register(spaces.Tuple)
def _(space: spaces.Tuple, batch: tuple[Any, ...], index: slice | np.ndarray) -> tuple[Any, ...]:
    return tuple(
        batch_slice(sub, part, index) for sub, part in zip(space.spaces, batch, strict=False)
    )


@singledispatch
def concat_batches(space: spaces.Space, batches: list[Any]) -> Any:
    """Join batches of ``space`` along the env axis.

    Args:
        space: The single-env space.
        batches: Batches of ``n_1, n_2, ...`` items in gymnasium's batched layout.

    Returns:
        One batch of ``sum(n_i)`` items in the same layout, in order.
    """
    return tuple(itertools.chain.from_iterable(batches))


@singledispatch
def stack_batches(space: spaces.Space, batches: list[Any]) -> Any:
    """Stack equally long batches of ``space`` on a new leading axis.

    Args:
        space: The single-env space.
        batches: ``m`` batches of ``n`` items each.

    Returns:
        Arrays of shape ``(m, n, ...)`` (nested like the space); for item batches, a
        tuple of the ``m`` batches.
    """
    return tuple(batches)


@singledispatch
def swap_leading_axes(space: spaces.Space, stacked: Any) -> Any:
    """Swap the two leading axes of a `stack_batches` result: ``[a][b]`` -> ``[b][a]``."""
    return tuple(zip(*stacked, strict=True))


def _concat_arrays(space: spaces.Space, batches: list[Any]) -> np.ndarray:
    return np.concatenate(batches, axis=0)


def _stack_arrays(space: spaces.Space, batches: list[Any]) -> np.ndarray:
    return np.stack(batches, axis=0)


def _swap_array_axes(space: spaces.Space, stacked: np.ndarray) -> np.ndarray:
    return np.swapaxes(stacked, 0, 1)


for _array_space in (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary):
    concat_batches.register(_array_space, _concat_arrays)
    stack_batches.register(_array_space, _stack_arrays)
    swap_leading_axes.register(_array_space, _swap_array_axes)


@concat_batches.register(spaces.Dict)
def _(space: spaces.Dict, batches: list[Any]) -> dict[str, Any]:
    return {k: concat_batches(sub, [b[k] for b in batches]) for k, sub in space.spaces.items()}


@concat_batches.register(spaces.Tuple)
def _(space: spaces.Tuple, batches: list[Any]) -> tuple[Any, ...]:
    return tuple(concat_batches(sub, [b[i] for b in batches]) for i, sub in enumerate(space.spaces))


@stack_batches.register(spaces.Dict)
def _(space: spaces.Dict, batches: list[Any]) -> dict[str, Any]:
    return {k: stack_batches(sub, [b[k] for b in batches]) for k, sub in space.spaces.items()}


@stack_batches.register(spaces.Tuple)
def _(space: spaces.Tuple, batches: list[Any]) -> tuple[Any, ...]:
    return tuple(stack_batches(sub, [b[i] for b in batches]) for i, sub in enumerate(space.spaces))


@swap_leading_axes.register(spaces.Dict)
def _(space: spaces.Dict, stacked: dict[str, Any]) -> dict[str, Any]:
    return {k: swap_leading_axes(sub, stacked[k]) for k, sub in space.spaces.items()}


@swap_leading_axes.register(spaces.Tuple)
def _(space: spaces.Tuple, stacked: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(swap_leading_axes(sub, stacked[i]) for i, sub in enumerate(space.spaces))


def to_numpy(actions: Any) -> Any:
    """Convert torch tensors (CPU or CUDA) inside ``actions`` to numpy arrays.

    Dicts and tuples are converted element-wise; a named tuple (such as a Graph space's
    `GraphInstance`) stays an instance of its own class; anything else is returned as is.
    torch is never imported here: a tensor is recognised by its `detach`/`cpu`/`numpy`
    methods.
    """
    if type(actions) is np.ndarray:  # the common case, without the failed lookups below
        return actions
    if hasattr(actions, "detach") and hasattr(actions, "cpu") and hasattr(actions, "numpy"):
        return actions.detach().cpu().numpy()
    if isinstance(actions, dict):
        return {key: to_numpy(value) for key, value in actions.items()}
    if isinstance(actions, tuple):
        values = [to_numpy(value) for value in actions]
        if hasattr(actions, "_fields"):  # a namedtuple: rebuild it as its own class
            return type(actions)(*values)
        return tuple(values)
    return actions


@singledispatch
def check_actions(space: spaces.Space, actions: Any, n: int, name: str = "actions") -> Any:
    """Check a batch of ``n`` actions against the single-env ``space`` and normalise it.

    Runs in the caller before any worker is sent anything, so a bad batch never moves an
    env.

    Args:
        space: The single-env action space.
        actions: The batch (numpy arrays; see `to_numpy` for tensors).
        n: Number of envs the batch must cover.
        name: How the batch is named in error messages.

    Returns:
        The batch in gymnasium's batched layout, with the caller's values and dtypes (as
        gymnasium's vector envs hand actions to the envs: a float64 batch for a float32
        Box reaches the envs as float64): array parts as numpy arrays (`np.asarray` of
        what was given), other parts as tuples of the given items.

    Raises:
        TypeError: A scalar where a batch of `n` actions is expected (gymnasium's
            vector envs raise TypeError there too); a space's own `contains` raised
            TypeError (re-raised naming the argument and the item).
        ValueError: Wrong length, shape or dtype kind, or a value outside a discrete space.
    """
    if not isinstance(actions, (tuple, list)) or len(actions) != n:
        if np.ndim(actions) == 0 and not isinstance(actions, (tuple, list)):
            raise TypeError(
                f"{name}: expected a batch of {n} actions (one per env) for {space}, "
                f"got a single {type(actions).__name__} {actions!r}"
            )
        got = f"length {len(actions)}" if isinstance(actions, (tuple, list)) else type(actions)
        raise ValueError(f"{name}: expected a sequence of {n} actions for {space}, got {got}")
    for i, action in enumerate(actions):
        try:
            inside = space.contains(action)
        except TypeError as exc:
            raise TypeError(
                f"{name}[{i}]={action!r}: {type(space).__name__}.contains raised "
                f"TypeError ({exc}) checking it against the action space {space}"
            ) from exc
        if not inside:
            raise ValueError(f"{name}[{i}]={action!r} is not in the action space {space}")
    return tuple(actions)


def _as_array(space: spaces.Space, actions: Any, n: int, name: str) -> np.ndarray:
    array = np.asarray(actions)
    if array.ndim == 0:
        raise TypeError(
            f"{name}: expected a batch of {n} actions (one per env, shape {(n, *space.shape)}) "
            f"for {space}, got a single {type(actions).__name__} {actions!r}"
        )
    shape = (n, *space.shape)
    if array.shape != shape:
        raise ValueError(
            f"{name}: expected shape {shape} (num envs {n} x {space.shape}) for {space}, "
            f"got shape {array.shape}"
        )
    return array


@check_actions.register(spaces.Box)
def _(space: spaces.Box, actions: Any, n: int, name: str = "actions") -> np.ndarray:
    array = _as_array(space, actions, n, name)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{name}: expected a numeric dtype for {space}, got {array.dtype}")
    if array.dtype.kind == "f" and space.dtype.kind in "iu":
        raise ValueError(
            f"{name}: expected dtype {space.dtype} (integer Box), got floating dtype {array.dtype}"
        )
    return array


def _check_integer(space: spaces.Space, array: np.ndarray, name: str) -> None:
    if array.dtype.kind not in "biu":
        raise ValueError(f"{name}: expected an integer dtype for {space}, got {array.dtype}")


@check_actions.register(spaces.Discrete)
def _(space: spaces.Discrete, actions: Any, n: int, name: str = "actions") -> np.ndarray:
    array = _as_array(space, actions, n, name)
    _check_integer(space, array, name)
    low, high = int(space.start), int(space.start) + int(space.n)
    bad = (array < low) | (array >= high)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}[{i}]={array[i]} is outside {space} (valid: {low}..{high - 1})")
    return array


@check_actions.register(spaces.MultiDiscrete)
def _(space: spaces.MultiDiscrete, actions: Any, n: int, name: str = "actions") -> np.ndarray:
    array = _as_array(space, actions, n, name)
    _check_integer(space, array, name)
    bad = (array < space.start) | (array >= space.start + space.nvec)
    if bad.any():
        i = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{name}[{i}]={array[i]} is outside {space}")
    return array


@check_actions.register(spaces.MultiBinary)
def _(space: spaces.MultiBinary, actions: Any, n: int, name: str = "actions") -> np.ndarray:
    array = _as_array(space, actions, n, name)
    _check_integer(space, array, name)
    bad = (array != 0) & (array != 1)
    if bad.any():
        i = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{name}[{i}]={array[i]} is not binary for {space}")
    return array


@check_actions.register(spaces.Dict)
def _(space: spaces.Dict, actions: Any, n: int, name: str = "actions") -> dict[str, Any]:
    if not isinstance(actions, dict) and np.ndim(actions) == 0:
        raise TypeError(f"{name}: expected a dict of batches for {space}, got {actions!r}")
    if not isinstance(actions, dict) or set(actions) != set(space.spaces):
        keys = sorted(actions) if isinstance(actions, dict) else type(actions)
        raise ValueError(f"{name}: expected a dict with keys {sorted(space.spaces)}, got {keys}")
    return {
        key: check_actions(sub, actions[key], n, f"{name}[{key!r}]")
        for key, sub in space.spaces.items()
    }


@check_actions.register(spaces.Tuple)
def _(space: spaces.Tuple, actions: Any, n: int, name: str = "actions") -> tuple[Any, ...]:
    if not isinstance(actions, (tuple, list)) and np.ndim(actions) == 0:
        raise TypeError(f"{name}: expected a tuple of batches for {space}, got {actions!r}")
    if not isinstance(actions, (tuple, list)) or len(actions) != len(space.spaces):
        raise ValueError(
            f"{name}: expected a tuple of {len(space.spaces)} batches for {space}, got {type(actions)}"
        )
    return tuple(
        check_actions(sub, part, n, f"{name}[{i}]")
        for i, (sub, part) in enumerate(zip(space.spaces, actions, strict=False))
    )
