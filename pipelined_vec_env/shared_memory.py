"""Observation buffers in named POSIX shared memory, laid out by gymnasium.

gymnasium's `gymnasium.vector.utils.create_shared_memory` takes a ``ctx`` whose
``Array(typecode, size)`` allocates each leaf buffer. Its own buffers
(``multiprocessing.Array``) can only reach a child at process start, but our workers
report their spaces *after* they start (envs are only ever built inside workers). So we
hand gymnasium an allocator of `multiprocessing.shared_memory.SharedMemory`
segments, which pickle by name and can be sent to a running worker. Layout, reads and
writes stay gymnasium's (``read_from_shared_memory`` / ``write_to_shared_memory``).
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import (
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)

_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)

__all__ = [
    "RowWriter",
    "SharedArray",
    "SharedMemoryAllocator",
    "create_observation_buffers",
    "release",
]


class SharedArray:
    """A ``multiprocessing.Array`` stand-in backed by a named shared memory segment.

    Only ``get_obj()`` is provided: it is all gymnasium's shared memory helpers use.
    Pickling sends the segment's name; unpickling attaches to the same segment.

    Args:
        nbytes: Size of the buffer in bytes.
        name: Attach to this existing segment instead of creating one.
    """

    def __init__(self, nbytes: int, name: str | None = None) -> None:
        self.nbytes = int(nbytes)
        if name is None:
            self._shm = shared_memory.SharedMemory(create=True, size=max(1, self.nbytes))
            self.owner = True
        else:
            self._shm = _attach_untracked(name)
            self.owner = False
        self.name = self._shm.name

    def get_obj(self) -> memoryview:
        """The raw buffer (``nbytes`` long), for ``np.frombuffer``."""
        return self._shm.buf[: self.nbytes]

    def __reduce__(self):
        return (SharedArray, (self.nbytes, self.name))

    def release(self) -> None:
        """Unmap the segment, and remove it if this process created it."""
        with contextlib.suppress(BufferError):
            # BufferError: the caller still holds numpy views (copy=False); the mapping
            # then lives until those views are garbage collected.
            self._shm.close()
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
            self.owner = False


_HAS_TRACK = "track" in inspect.signature(shared_memory.SharedMemory).parameters


def _attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Attach to the existing segment ``name`` without registering it with a resource
    tracker.

    The creating process owns the segment: it registered it when creating it and unlinks
    it at ``close()`` (or its resource tracker does, after a hard kill). A process that
    only attaches must not register it too: under ``context="fork"`` a worker forked
    before the caller's tracker existed starts a tracker of its own, which would warn
    about a "leaked" segment at every clean exit and unlink the segment when the worker
    is killed, so that its restart could not attach. Python 3.13+ has ``track=False``;
    before, the registration is skipped for this one call (only workers attach, from
    their main thread).
    """
    if _HAS_TRACK:  # pragma: no cover - Python >= 3.13
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register


class SharedMemoryAllocator:
    """The ``ctx`` argument for gymnasium's ``create_shared_memory``: allocates
    [`SharedArray`][pipelined_vec_env.shared_memory.SharedArray] buffers and remembers them so they can be released."""

    def __init__(self) -> None:
        self.arrays: list[SharedArray] = []

    def Array(self, typecode: Any, size: int) -> SharedArray:  # noqa: N802 (mp's name)
        itemsize = (
            ctypes.sizeof(typecode) if isinstance(typecode, type) else np.dtype(typecode).itemsize
        )
        array = SharedArray(itemsize * int(size))
        self.arrays.append(array)
        return array


def create_observation_buffers(space: spaces.Space, n: int) -> tuple[Any, list[SharedArray]] | None:
    """Create shared observation buffers for ``n`` envs of ``space``.

    Returns:
        ``(buffers, arrays)`` where ``buffers`` is gymnasium's nested structure of
        [`SharedArray`][pipelined_vec_env.shared_memory.SharedArray] and ``arrays`` lists every segment (to release them), or
        ``None`` when the space has no shared memory layout (Graph, Sequence, custom
        spaces): observations then travel through the pipe.
    """
    allocator = SharedMemoryAllocator()
    try:
        buffers = create_shared_memory(space, n=n, ctx=allocator)  # type: ignore[arg-type]
    except Exception:  # CustomSpaceError / TypeError: no shared layout for this space
        release(allocator.arrays)
        return None
    return buffers, allocator.arrays


def release(arrays: list[SharedArray]) -> None:
    """Release every segment in ``arrays``."""
    for array in arrays:
        array.release()


def _array_leaves(space: spaces.Space) -> bool:
    """Whether every leaf of ``space`` is a fixed-layout array (Box, Discrete ...), nested
    in Dict and Tuple spaces: gymnasium's reads of its buffers are then plain views."""
    if isinstance(space, spaces.Dict):
        return all(_array_leaves(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return all(_array_leaves(s) for s in space.spaces)
    return isinstance(space, _ARRAY_SPACES)


def _write_leaves(views: Any, g: int, value: Any) -> None:
    if isinstance(views, dict):
        for key, view in views.items():
            _write_leaves(view, g, value[key])
    elif isinstance(views, tuple):
        for view, part in zip(views, value, strict=True):
            _write_leaves(view, g, part)
    else:
        array = np.asarray(value)
        if array.shape != views.shape[1:]:  # gymnasium's write takes any array of its size
            array = array.reshape(views.shape[1:])
        views[g] = array  # one copy, cast to the buffer's dtype as gymnasium casts


class RowWriter:
    """Writes one env's observation into gymnasium's shared buffers with one copy per array.

    gymnasium's ``write_to_shared_memory`` flattens each array before copying it into
    the buffer: two copies of every camera frame. Here each array of the observation is
    copied once, straight into its row of a view of the buffers kept from the start
    (``np.copyto``, values cast to the space's dtype as gymnasium casts them). Spaces
    whose leaves are not all fixed-layout arrays (Text, OneOf ...) are written by
    gymnasium's function.

    Args:
        space: The single observation space.
        buffers: gymnasium's shared memory buffers for ``num_envs`` envs of ``space``.
        num_envs: Envs the buffers hold.
    """

    def __init__(self, space: spaces.Space, buffers: Any, num_envs: int) -> None:
        self.space, self.buffers = space, buffers
        self.views = (
            read_from_shared_memory(space, buffers, n=num_envs) if _array_leaves(space) else None
        )

    def write(self, g: int, value: Any) -> None:
        """Write ``value`` (an item of ``space``) as env ``g``'s observation."""
        if self.views is None:
            write_to_shared_memory(self.space, g, value, self.buffers)
        else:
            _write_leaves(self.views, g, value)
