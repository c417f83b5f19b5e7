"""The observations of a vector env's envs: where they live, how they are read and copied.

With shared memory (the space has a fixed layout and the backend is local) the workers
write each env's observation into gymnasium's buffers (`shared_memory`) and answers carry
none; otherwise each answer carries the observations as items, kept here per env. Either
way the vector env, stage stepping and decoupled stepping read batches, single items and
copies through one `ObservationStore`.

A copying step of large observations (camera frames) writes into a generation of the
buffers that nothing the caller holds refers to and returns views of it
(`observation_ring`); where none is free, its copy is made worker by worker
(`RowCopy`): the rows of one worker are copied as its answer comes, while the other
workers still step, instead of the whole batch once the last one answered. Each env's
latest observation is in the generation its last command wrote (0: the first buffers).
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Callable
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium import Space, spaces
from gymnasium.vector.utils import (
    batch_space,
    concatenate,
    create_empty_array,
    iterate,
    read_from_shared_memory,
    write_to_shared_memory,
)

from .batching import batch_slice, leaves
from .observation_ring import ObservationRing, make_ring
from .shared_memory import create_observation_buffers, release

__all__ = ["ObservationStore", "RowCopy", "leaves"]

logger = logging.getLogger(__name__)


def _views_stay_valid(space: Space) -> bool:
    """Whether gymnasium's ``read_from_shared_memory`` returns views (not decoded copies)."""
    if isinstance(space, spaces.Dict):
        return all(_views_stay_valid(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return all(_views_stay_valid(s) for s in space.spaces)
    return isinstance(
        space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
    )


class RowCopy:
    """A copy of the observations of the envs ``envs`` in shared memory, made a run of
    rows at a time (`copy_rows`) as workers answer, finished by `result`.

    It reads the store's views at each copy and keeps none: a copy left unfinished (a
    failed wait, whose traceback holds it) does not keep the segments mapped.

    Args:
        store: The observations (with views in shared memory, `ObservationStore.views`).
        envs: The envs of the copy (global ids).
        batch: Where the copy goes: a batch of ``envs`` in gymnasium's layout that
            nothing else references (`ObservationStore.row_copy` picks it).
    """

    __slots__ = ("_done", "_out", "_store", "batch", "start", "stop")

    def __init__(self, store: ObservationStore, envs: slice, batch: Any) -> None:
        self.start, self.stop = envs.start, envs.stop
        self._store = store
        self.batch = batch
        self._out = leaves(self.batch)
        self._done = np.zeros(self.stop - self.start, dtype=np.bool_)

    def copy_rows(self, lo: int, hi: int) -> None:
        """Copy the rows of the envs ``lo .. hi - 1`` (global ids within the copy's)."""
        views = self._store.views
        if views is None:  # released: nothing left to copy from
            return
        a, b = lo - self.start, hi - self.start
        for out, view in zip(self._out, leaves(views), strict=True):
            out[a:b] = view[lo:hi]
        self._done[a:b] = True

    @property
    def complete(self) -> bool:
        """Whether every row was copied."""
        return bool(self._done.all())

    def result(self) -> Any:
        """The batch (a new one, the caller's), after copying every row not copied yet."""
        if not self.complete:
            todo = np.flatnonzero(~self._done)
            # runs of consecutive rows: one slice copy each
            breaks = np.flatnonzero(np.diff(todo) != 1) + 1
            for run in np.split(todo, breaks):
                self.copy_rows(self.start + int(run[0]), self.start + int(run[-1]) + 1)
        return self.batch


#: Smallest batch (bytes) a step copies worker by worker (`RowCopy`); a smaller one is
#: copied at once at the end, where the copy costs less than the bookkeeping (a few
#: microseconds: light state observations).
ROW_COPY_MIN_BYTES = 256 * 1024

#: Batches a step returned that the store keeps, per slice of envs, to reuse once nothing
#: else references them (the caller's variable still holds the last one at the next step).
KEPT_BATCHES = 3


def _nodes(batch: Any) -> list[Any]:
    """A batch's containers and arrays, depth first (the batch itself first)."""
    if isinstance(batch, dict):
        return [batch, *(n for value in batch.values() for n in _nodes(value))]
    if isinstance(batch, tuple):
        return [batch, *(n for value in batch for n in _nodes(value))]
    return [batch]


def _ids(batch: Any) -> tuple[int, ...]:
    """The identities of a batch's nodes: a batch whose caller replaced or added an array
    or a key is not the one the store made."""
    return tuple(id(n) for n in _nodes(batch))


def _refcounts(batch: Any) -> list[int]:
    """The reference counts of ``batch`` and of each of its nodes, as seen from here."""
    counts = [sys.getrefcount(batch)]
    nodes = _nodes(batch)
    for k in range(1, len(nodes)):
        counts.append(sys.getrefcount(nodes[k]))
    return counts


def _calibrate() -> tuple[int, int] | None:
    """The counts `_refcounts` sees for a kept batch nothing else references: ``(root,
    node)``; None where the interpreter has no reference counts."""
    if not hasattr(sys, "getrefcount"):
        return None
    sample = {"a": np.zeros(1), "b": (np.zeros(1),)}
    kept: deque[tuple[Any, tuple[int, ...]]] = deque([(sample, _ids(sample))])
    del sample
    counts = _refcounts(kept[0][0])
    if len(set(counts[1:])) != 1:
        return None
    return counts[0], counts[1]


_UNREFERENCED = _calibrate()


def _unreferenced(counts: list[int]) -> bool:
    """Whether `_refcounts` of a kept batch say nothing but the store references it."""
    if _UNREFERENCED is None:
        return False
    root, node = _UNREFERENCED
    return counts[0] == root and all(c == node for c in counts[1:])


def _first(space: Space, batch: Any) -> Any:
    """The single item of a batch of one."""
    return next(iter(iterate(batch_space(space, 1), batch)))


class ObservationStore:
    """The latest observation of each of ``num_envs`` envs of ``space``.

    Args:
        space: The envs' single observation space.
        num_envs: Number of envs.
        shared: Put the observations in shared memory if the space has a layout for it
            (else, or when False, they are kept as the items the answers carry).
        shm_fallback: Where the buffers do not fit in /dev/shm: ``"file"`` (file-backed,
            with a warning) or ``"error"`` (`SharedMemoryFullError`); see
            `create_observation_buffers`.
        ring: Make an `ObservationRing` for copying steps, where the batch is
            `ROW_COPY_MIN_BYTES` or more, its reads are views and its buffers fit in
            /dev/shm.

    Attributes:
        buffers: gymnasium's shared memory buffers for the workers to write into
            (`WorkerPool.attach` hands them on), or None.
        segments: The shared memory segments behind ``buffers`` and the ring's
            generations (released by `release`).
    """

    def __init__(
        self,
        space: Space,
        num_envs: int,
        shared: bool,
        shm_fallback: str = "file",
        ring: bool = False,
    ) -> None:
        self.space = space
        self.num_envs = num_envs
        self.buffers: Any = None
        self.segments: list[Any] = []
        self._items: list[Any] = [None] * num_envs
        self._on_release: list[Callable[[], None]] = []
        # batches returned by copies, to reuse (`_free_batch`)
        self._kept: dict[tuple[int, int], deque[tuple[Any, tuple[int, ...]]]] = {}
        if shared:
            created = create_observation_buffers(space, num_envs, shm_fallback)
            if created is not None:
                self.buffers, self.segments = created
            else:
                logger.info(
                    "no shared memory layout for %s; observations go through the pipe", space
                )
        self._view = None  # the whole batch in shared memory, as views (where they stay valid)
        if self.buffers is not None and _views_stay_valid(space):
            self._view = read_from_shared_memory(space, self.buffers, n=num_envs)
        self._env_bytes = 0 if self._view is None else sum(a.nbytes for a in leaves(self._view))
        self._env_bytes //= num_envs
        # a single numeric array (Box, Discrete, ...): `batch` slices and copies it directly
        self._array = isinstance(self._view, np.ndarray) and self._view.dtype != object
        self._ring: ObservationRing | None = None
        if (
            ring
            and self._view is not None
            and self._env_bytes * num_envs >= ROW_COPY_MIN_BYTES
            and not any(segment.path for segment in self.segments)  # /dev/shm was too small
        ):
            self._ring = make_ring(space, num_envs, sum(s.nbytes for s in self.segments))
            if self._ring is not None:
                self.segments = [*self.segments, *self._ring.segments]
        self._latest = np.zeros(num_envs, dtype=np.int64)  # generation of each env's latest
        self._pinned = False  # `views` were handed out: steps write the first buffers
        self._in_flight: dict[tuple[int, int], int] = {}  # steps sent: their generations

    @property
    def shared(self) -> bool:
        """Observations live in shared memory (answers carry none)."""
        return self.buffers is not None

    @property
    def views(self) -> Any:
        """The whole batch of ``num_envs`` observations in shared memory as numpy views
        (gymnasium's batched layout), or None (no shared memory, or a space whose reads
        decode copies: Text, OneOf). Env ``g``'s rows hold its latest result and are
        overwritten while a command to it is in flight (a copying step may write a
        generation of the ring instead: see `hand_out_views`)."""
        return self._view

    def hand_out_views(self) -> Any:
        """`views`, for the caller to keep: this ends the ring, so that env ``g``'s rows
        keep holding its latest result. From now on every step writes these buffers;
        the latest observations of idle envs are copied into them now, those of envs
        stepping into a generation when their step is collected."""
        if self._ring is not None and not self._pinned:
            self._pinned = True
            busy = np.zeros(self.num_envs, dtype=np.bool_)
            for lo, hi in self._in_flight:
                busy[lo:hi] = True
            self._gather_first(np.flatnonzero((self._latest != 0) & ~busy))
        return self._view

    @property
    def generations(self) -> list[Any]:
        """gymnasium's buffers of each generation of the ring (beside `buffers`), for the
        workers to write into (`WorkerPool.attach`); empty without a ring."""
        return [] if self._ring is None else list(self._ring.buffers)

    def begin_step(self, envs: slice, copy: bool) -> int:
        """The generation a step of the envs ``envs`` writes (0: the first buffers): with
        ``copy``, one of the ring's that nothing refers to, where there is one (recorded
        until `end_step`)."""
        if self._ring is None:  # light observations: nothing to record
            return 0
        gen = 0
        if copy and not self._pinned:
            lo, hi = envs.start, envs.stop
            busy = {g for (a, b), g in self._in_flight.items() if a < hi and lo < b}
            gen = self._ring.acquire(envs, busy)
        self._in_flight[(envs.start, envs.stop)] = gen
        return gen

    def step_generation(self, envs: slice) -> int:
        """The generation the step of ``envs`` in flight writes (0: the first buffers)."""
        if self._ring is None:
            return 0
        return self._in_flight.get((envs.start, envs.stop), 0)

    def end_step(self, envs: slice, real: np.ndarray | None = None) -> int:
        """The generation the step of ``envs`` wrote, now collected: it holds the latest
        observations of the envs whose results are real (``real``, one bool per env of
        ``envs``; None: all)."""
        if self._ring is None:
            return 0
        gen = self._in_flight.pop((envs.start, envs.stop), 0)
        if real is None:
            self._latest[envs] = gen
        else:
            self._latest[envs][real] = gen
        return gen

    def begin_first(self, ids: Any) -> None:
        """The commands sent to the envs ``ids`` (a reset, a ``send``'s step) write the
        first buffers."""
        if self._ring is not None:
            self._latest[np.asarray(ids, dtype=np.intp)] = 0

    def step_batch(self, envs: slice, gen: int) -> Any:
        """The observations of a step of ``envs`` written into ring generation ``gen``:
        views the ring does not write again while any array made from them lives (with
        `views` handed out, also copied into the first buffers)."""
        assert self._ring is not None and gen > 0
        if self._pinned:
            self._gather_first(np.arange(envs.start, envs.stop))
        return self._ring.batch(gen, envs)

    def _gather_first(self, ids: np.ndarray) -> None:
        """Copy the latest observations of the envs ``ids`` from their generations into
        the first buffers."""
        if self._ring is None or self._view is None or len(ids) == 0:
            return
        self._copy_latest(ids, self._view, ids)
        self._latest[ids] = 0

    def _assembled(self, envs: slice) -> Any:
        """A new batch of the latest observations of ``envs``, each row read from its
        generation."""
        ids = np.arange(envs.start, envs.stop)
        batch = create_empty_array(self.space, n=len(ids), fn=np.empty)
        self._copy_latest(ids, batch, np.arange(len(ids)))
        return batch

    def _copy_latest(self, ids: np.ndarray, out: Any, rows: np.ndarray) -> None:
        """Copy the latest observation of each env ``ids[k]`` (from its generation) into
        row ``rows[k]`` of ``out`` (a batch in gymnasium's layout)."""
        assert self._ring is not None and self._view is not None
        latest = self._latest[ids]
        for gen in np.unique(latest).tolist():
            chosen = latest == gen
            source = self._view if gen == 0 else self._ring.views(gen)
            for dest, view in zip(leaves(out), leaves(source), strict=True):
                dest[rows[chosen]] = view[ids[chosen]]

    def row_copy(self, envs: slice) -> RowCopy | None:
        """A `RowCopy` of the envs ``envs``, or None where the observations have no views
        in shared memory or their batch is under `ROW_COPY_MIN_BYTES` (`batch` copies
        them then)."""
        if self._view is None or self._env_bytes * (envs.stop - envs.start) < ROW_COPY_MIN_BYTES:
            return None
        return RowCopy(self, envs, self._free_batch(envs))

    def _free_batch(self, envs: slice, key: tuple[int, int] | None = None) -> Any:
        """A batch for a copy of the envs ``envs``: one returned earlier (under ``key``,
        by default the slice's bounds) that nothing references any more (its reference
        counts say so), else a new one, kept.

        New memory costs a page fault per page at its first write, more than the copy
        itself (``benchmarks/frames.py`` times both); a batch the caller let go is
        already mapped. One the caller still holds (a rollout's list, a view, a tensor
        made with ``torch.from_numpy``) is referenced, so never reused."""
        if key is None:
            key = (envs.start, envs.stop)
        kept = self._kept.get(key)
        if kept is None:
            kept = self._kept[key] = deque()
        for k in range(len(kept)):
            if _unreferenced(_refcounts(kept[k][0])) and _ids(kept[k][0]) == kept[k][1]:
                entry = kept[k]
                del kept[k]
                kept.append(entry)  # the latest returned goes last
                return entry[0]
        batch = create_empty_array(self.space, n=envs.stop - envs.start, fn=np.empty)
        kept.append((batch, _ids(batch)))
        if len(kept) > KEPT_BATCHES:
            kept.popleft()
        return batch

    def keep(self, g: int, item: Any) -> None:
        """Remember ``item`` (from an answer) as env ``g``'s latest observation."""
        self._items[g] = item

    def write(self, g: int, item: Any) -> None:
        """Write ``item`` as env ``g``'s observation into shared memory."""
        write_to_shared_memory(self.space, g, item, self.buffers)
        if self._ring is not None:
            self._latest[g] = 0

    def single(self, g: int) -> Any:
        """A copy of env ``g``'s observation in shared memory, as a single item."""
        if self._ring is not None and self._latest[g] != 0:
            return _first(self.space, self._assembled(slice(g, g + 1)))
        return _first(
            self.space, deepcopy(batch_slice(self.space, self._shared(), slice(g, g + 1)))
        )

    def rows(self, ids: np.ndarray) -> Any:
        """A batch (copies) of the observations in shared memory of the envs ``ids``.

        A batch of `ROW_COPY_MIN_BYTES` or more is copied one run of consecutive envs at
        a time (a ``recv``'s answers are whole workers' runs) into a batch returned
        earlier for as many envs that nothing references any more (`_free_batch`)."""
        n = len(ids)
        if self._ring is not None and self._latest[ids].any():  # none in flight: all answered
            self._gather_first(np.asarray(ids))
        if self._view is not None and self._env_bytes * n >= ROW_COPY_MIN_BYTES:
            batch = self._free_batch(slice(0, n), key=(-1, n))
            starts = np.flatnonzero(np.diff(ids, prepend=ids[0] - 2) != 1)
            ends = np.append(starts[1:], n)
            view_leaves = leaves(self._view)
            for out, view in zip(leaves(batch), view_leaves, strict=True):
                for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
                    first = int(ids[a])
                    out[a:b] = view[first : first + b - a]
            return batch
        if self._array:
            return self._view[ids]  # type: ignore[index]
        return batch_slice(self.space, self._shared(), ids)

    def batch(self, envs: slice, copy: bool) -> Any:
        """The observations of the envs ``envs`` as one batch (gymnasium's layout).

        Args:
            envs: Which envs.
            copy: Return copies (else, with shared memory, views that the workers
                overwrite at the next step).
        """
        if self._ring is not None and self._latest[envs].any():
            if copy:
                return self._assembled(envs)
            self._gather_first(np.arange(envs.start, envs.stop))
        if self._array:
            batch = self._view[envs]  # type: ignore[index]
            return batch.copy() if copy else batch
        if self.buffers is not None:
            batch = batch_slice(self.space, self._shared(), envs)
            return deepcopy(batch) if copy else batch
        items = self._items[envs]
        return concatenate(
            self.space, items, create_empty_array(self.space, n=len(items), fn=np.zeros)
        )

    def on_release(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` in `release`, before the segments are unmapped."""
        self._on_release.append(callback)

    def release(self) -> None:
        """Drop the views and unlink the shared memory segments (after the workers stop);
        the `on_release` callbacks run first (each once; one that raises is logged)."""
        callbacks, self._on_release = self._on_release, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.warning("an observation release callback raised", exc_info=True)
        self._kept = {}
        if self._ring is not None:
            self._ring.release()
            self._ring = None
        # drop our views first: a segment with live views cannot be unmapped
        self._view = self.buffers = None
        self._array = False
        release(self.segments)
        self.segments = []

    def _shared(self) -> Any:
        """The whole batch of observations in shared memory (views where possible)."""
        if self._view is not None:
            return self._view
        # Text and OneOf are decoded on every read
        return read_from_shared_memory(self.space, self.buffers, n=self.num_envs)
