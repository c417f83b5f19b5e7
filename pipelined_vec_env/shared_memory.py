"""Observation buffers in named POSIX shared memory, laid out by gymnasium.

gymnasium's `gymnasium.vector.utils.create_shared_memory` takes a ``ctx`` whose
``Array(typecode, size)`` allocates each leaf buffer. Its own buffers
(``multiprocessing.Array``) can only reach a child at process start, but our workers
report their spaces *after* they start (envs are only ever built inside workers). So we
hand gymnasium an allocator of `multiprocessing.shared_memory.SharedMemory`
segments, which pickle by name and can be sent to a running worker. Layout, reads and
writes stay gymnasium's (``read_from_shared_memory`` / ``write_to_shared_memory``).

A segment on a full /dev/shm (a tmpfs) is created without error and kills the first
process that writes past the free space with SIGBUS. So before creating the buffers their
total size is compared with the free space of /dev/shm (``os.statvfs``); where they do not
fit they are file-backed mappings in a temporary directory instead (as
``multiprocessing``'s heap falls back), with one warning, or, with
``shm_fallback="error"``, `SharedMemoryFullError`. The files are removed at `release`, and
a directory left by a process that died is removed by the next process that creates one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import inspect
import mmap
import os
import shutil
import tempfile
import warnings
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
    "SHM_DIR",
    "SHM_FALLBACKS",
    "SharedArray",
    "SharedMemoryAllocator",
    "SharedMemoryFallbackWarning",
    "SharedMemoryFullError",
    "create_observation_buffers",
    "release",
]

#: Where POSIX shared memory lives on Linux (a tmpfs).
SHM_DIR = "/dev/shm"
#: ``shm_fallback`` values: file-backed buffers (with a warning) or an error.
SHM_FALLBACKS = ("file", "error")
_FILE_PREFIX = "pipelined-vec-env-buffers-"


class SharedMemoryFallbackWarning(RuntimeWarning):
    """The observation buffers did not fit in /dev/shm: they are file-backed instead."""


class SharedMemoryFullError(OSError):
    """The observation buffers do not fit in /dev/shm and ``shm_fallback="error"``.

    Attributes:
        needed: Bytes the buffers need.
        free: Bytes free in /dev/shm.
    """

    def __init__(self, needed: int, free: int) -> None:
        super().__init__(_too_small(needed, free) + ' (shm_fallback="error")')
        self.needed, self.free = needed, free

    def __reduce__(self) -> tuple[Any, tuple[int, int]]:
        return type(self), (self.needed, self.free)


def _too_small(needed: int, free: int) -> str:
    return (
        f"the observation buffers need {needed} bytes ({needed / 2**20:.1f} MiB) but "
        f"{SHM_DIR} has {free} bytes ({free / 2**20:.1f} MiB) free. " + _GROW_SHM
    )


_GROW_SHM = (
    "Give the container a bigger /dev/shm: `docker run --shm-size=2g ...`, or in Kubernetes "
    "mount an `emptyDir` with `medium: Memory` (and a `sizeLimit`) at /dev/shm"
)


def shm_free_bytes() -> int | None:
    """Bytes free for unprivileged use in /dev/shm, or None where it cannot be read."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


class SharedArray:
    """A ``multiprocessing.Array`` stand-in backed by a named shared memory segment, or by
    a file (``path``) where /dev/shm is too small.

    Only ``get_obj()`` is provided: it is all gymnasium's shared memory helpers use.
    Pickling sends the segment's name (or the file's path); unpickling attaches to it.

    Args:
        nbytes: Size of the buffer in bytes.
        name: Attach to this existing segment instead of creating one.
        path: A file-backed buffer: create this file (``create=True``) or attach to it.
        create: With ``path``: create the file (its blocks allocated, so that a full disk
            is an `OSError` here, never a SIGBUS later).
    """

    def __init__(
        self, nbytes: int, name: str | None = None, path: str | None = None, create: bool = False
    ) -> None:
        self.nbytes = int(nbytes)
        self.path = path
        self._shm: shared_memory.SharedMemory | None = None
        self._map: mmap.mmap | None = None
        if path is not None:
            self._map = _map_file(path, max(1, self.nbytes), create)
            self.owner = create
            self.name = path
        elif name is None:
            self._shm = shared_memory.SharedMemory(create=True, size=max(1, self.nbytes))
            self.owner = True
            self.name = self._shm.name
            self._map = _reserve(self._shm, max(1, self.nbytes))
        else:
            self._shm = _attach_untracked(name)
            self.owner = False
            self.name = self._shm.name

    def get_obj(self) -> memoryview:
        """The raw buffer (``nbytes`` long), for ``np.frombuffer``."""
        if self._map is not None:
            return memoryview(self._map)[: self.nbytes]
        assert self._shm is not None
        return self._shm.buf[: self.nbytes]

    def __reduce__(self):
        if self.path is not None:
            return (SharedArray, (self.nbytes, None, self.path))
        return (SharedArray, (self.nbytes, self.name))

    def release(self) -> None:
        """Unmap the buffer, and remove it if this process created it."""
        with contextlib.suppress(BufferError):
            # BufferError: the caller still holds numpy views (copy=False); the mapping
            # then lives until those views are garbage collected.
            if self._map is not None:
                self._map.close()
            elif self._shm is not None:
                self._shm.close()
        if self.owner:
            if self.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
                with contextlib.suppress(OSError):  # the directory's last file
                    os.rmdir(os.path.dirname(self.path))
            elif self._shm is not None:
                with contextlib.suppress(FileNotFoundError):
                    self._shm.unlink()
            self.owner = False


def _reserve(shm: shared_memory.SharedMemory, nbytes: int) -> mmap.mmap | None:
    """Allocate the pages of the new segment ``shm`` now and map it with a mapping of our
    own, or None where its file is not under /dev/shm (the segment's own mapping serves).

    A segment is created sparse: on a full /dev/shm the first write past the free space
    kills the writer with SIGBUS. ``posix_fallocate`` makes that an `OSError` (ENOSPC)
    here, with the segment removed. The segment's own mapping is closed at once (nothing
    refers to it yet): the caller's views then live on a plain ``mmap``, which at exit,
    unlike a ``SharedMemory`` still referred to, prints no ``BufferError``.

    Raises:
        OSError: /dev/shm has no room for ``nbytes`` (ENOSPC).
    """
    path = os.path.join(SHM_DIR, shm.name.lstrip("/"))
    if not hasattr(os, "posix_fallocate") or not os.path.exists(path):
        return None
    shm.close()  # nothing refers to its mapping yet
    try:
        return _map_file(path, nbytes, create=False, allocate=True)
    except OSError as exc:
        shm.unlink()
        raise OSError(
            exc.errno,
            f"{SHM_DIR} has no room for a shared memory segment of {nbytes} bytes "
            f"({shm_free_bytes()} bytes free). " + _GROW_SHM,
        ) from exc


def _map_file(path: str, nbytes: int, create: bool, allocate: bool | None = None) -> mmap.mmap:
    """Map file ``path`` of ``nbytes`` shared; with ``create`` the file is made first.
    With ``allocate`` (by default: ``create``) its blocks are allocated, so that no room
    for them is an `OSError` (ENOSPC) here, never a SIGBUS at a later write."""
    fd = os.open(path, (os.O_CREAT | os.O_EXCL | os.O_RDWR) if create else os.O_RDWR, 0o600)
    try:
        if create if allocate is None else allocate:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, nbytes)
            else:  # pragma: no cover - platforms without posix_fallocate
                os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


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
    [`SharedArray`][pipelined_vec_env.shared_memory.SharedArray] buffers (in ``directory``
    as files where it is given) and remembers them so they can be released; with
    ``count_only`` it only adds up their sizes (``nbytes``)."""

    def __init__(self, directory: str | None = None, count_only: bool = False) -> None:
        self.arrays: list[SharedArray] = []
        self.directory = directory
        self.count_only = count_only
        self.nbytes = 0

    def Array(self, typecode: Any, size: int) -> SharedArray | None:  # noqa: N802 (mp's name)
        itemsize = (
            ctypes.sizeof(typecode) if isinstance(typecode, type) else np.dtype(typecode).itemsize
        )
        nbytes = itemsize * int(size)
        self.nbytes += nbytes
        if self.count_only:
            return None
        if self.directory is None:
            array = SharedArray(nbytes)
        else:
            path = os.path.join(self.directory, f"{len(self.arrays)}.buf")
            array = SharedArray(nbytes, path=path, create=True)
        self.arrays.append(array)
        return array


def create_observation_buffers(
    space: spaces.Space, n: int, shm_fallback: str = "file"
) -> tuple[Any, list[SharedArray]] | None:
    """Create shared observation buffers for ``n`` envs of ``space``.

    In /dev/shm where they fit (``os.statvfs``: its free space against their total size),
    else as file-backed mappings in a new directory under `tempfile.gettempdir` with one
    `SharedMemoryFallbackWarning` that names the bytes needed and free and how to grow /dev/shm.

    Args:
        space: One env's observation space.
        n: Number of envs.
        shm_fallback: ``"file"`` (the fallback above) or ``"error"``.

    Returns:
        ``(buffers, arrays)`` where ``buffers`` is gymnasium's nested structure of
        [`SharedArray`][pipelined_vec_env.shared_memory.SharedArray] and ``arrays`` lists every buffer (to release them), or
        ``None`` when the space has no shared memory layout (Graph, Sequence, custom
        spaces): observations then travel through the pipe.

    Raises:
        SharedMemoryFullError: They do not fit and ``shm_fallback="error"``.
        OSError: The temporary directory's file system is full too.
    """
    counter = SharedMemoryAllocator(count_only=True)
    try:
        create_shared_memory(space, n=n, ctx=counter)  # type: ignore[arg-type]
    except Exception:  # CustomSpaceError / TypeError: no shared layout for this space
        return None
    free = shm_free_bytes()
    directory = None
    if free is not None and counter.nbytes > free:
        directory = _fall_back(counter.nbytes, free, shm_fallback)
    try:
        return _allocate(space, n, directory)
    except OSError as exc:  # /dev/shm filled up since its free space was read
        if directory is not None or exc.errno != errno.ENOSPC:
            raise
    directory = _fall_back(counter.nbytes, shm_free_bytes() or 0, shm_fallback)
    return _allocate(space, n, directory)


def _allocate(space: spaces.Space, n: int, directory: str | None) -> tuple[Any, list[SharedArray]]:
    """gymnasium's buffers for ``n`` envs of ``space`` and their arrays, in /dev/shm or as
    files in ``directory``; on failure, whatever was made is released."""
    allocator = SharedMemoryAllocator(directory)
    try:
        buffers = create_shared_memory(space, n=n, ctx=allocator)  # type: ignore[arg-type]
    except BaseException:
        release(allocator.arrays)
        raise
    return buffers, allocator.arrays


def _fall_back(needed: int, free: int, shm_fallback: str) -> str:
    """A new directory for file-backed buffers, with one `SharedMemoryFallbackWarning`;
    with ``shm_fallback="error"``, `SharedMemoryFullError` instead."""
    if shm_fallback == "error":
        raise SharedMemoryFullError(needed, free)
    directory = _buffer_directory()
    warnings.warn(
        _too_small(needed, free)
        + f". Using file-backed buffers in {directory} instead (removed at close); "
        'pass shm_fallback="error" to raise instead.',
        SharedMemoryFallbackWarning,
        stacklevel=3,
    )
    return directory


def _buffer_directory() -> str:
    """A new directory for file-backed buffers, named with this process's id; directories
    of processes that no longer exist (a caller killed before its close) are removed."""
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.name.startswith(_FILE_PREFIX) and not _alive(entry.name):
                shutil.rmtree(entry.path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_FILE_PREFIX}{os.getpid()}-", dir=root)


def _alive(directory_name: str) -> bool:
    """Whether the process that made buffer directory ``directory_name`` still runs."""
    try:
        pid = int(directory_name[len(_FILE_PREFIX) :].split("-", 1)[0])
    except ValueError:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release(arrays: list[SharedArray]) -> None:
    """Release every buffer in ``arrays``."""
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
