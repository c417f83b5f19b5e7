"""Generations of the shared observation buffers that a copying step returns in place.

A ``copy=True`` step returns observations the caller owns: no later step changes them.
Copying them out of the buffers the workers write costs the caller a pass over every
byte (for two 224 px cameras, 301 KB an env), after the last worker answered. With a
ring, the workers write a step's observations into a *generation* of the buffers (a
second and third set, beside the first that ``copy=False`` views and
``shared_observations`` show) that nothing the caller holds refers to, and the step
returns views of it: the caller copies nothing.

A generation is written again only once no array made from it is alive. numpy keeps the
first array made over a buffer as the ``base`` of every view of its views, so the
reference count of that base array (one per generation, per slice of envs returned) says
whether any such array lives: a dict of views kept in a rollout list, one camera's array,
a ``torch.from_numpy`` tensor (which holds its array). Where every generation is still
referenced (a rollout that keeps each step's arrays), the step is written into the first
buffers and copied out of them, as without a ring.

The idea is double buffering (a GPU's swap chain; pipelines' ping-pong buffers), with
numpy's reference counts standing for the consumer's release.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np
from gymnasium import Space
from gymnasium.vector.utils import read_from_shared_memory

from .batching import batch_slice, leaves
from .shared_memory import (
    SharedMemoryFullError,
    create_observation_buffers,
    release,
    shm_free_bytes,
)

__all__ = ["ObservationRing", "RING_GENERATIONS"]

logger = logging.getLogger(__name__)

#: Generations beside the first buffers: the caller's variable still holds the last
#: step's observations while the next step is written, so two let a loop that drops them
#: then alternate.
RING_GENERATIONS = 2


def _counts(roots: list[np.ndarray]) -> list[int]:
    """The reference counts of ``roots``' arrays, as seen from here (one code path for the
    baseline and every check, so both see the same references of their own)."""
    return [sys.getrefcount(root) for root in roots]


class _Window:
    """One slice of envs of one generation, as returned: the views' tree over the whole
    generation (made once), the arrays every view of it keeps as ``base``, and their
    reference counts while nothing else holds them."""

    __slots__ = ("baseline", "roots", "span", "tree")

    def __init__(self, space: Space, buffers: Any, num_envs: int, span: tuple[int, int]):
        self.span = span
        self.tree = read_from_shared_memory(space, buffers, n=num_envs)
        self.roots = [leaf if leaf.base is None else leaf.base for leaf in leaves(self.tree)]
        self.baseline = _counts(self.roots)

    def referenced(self) -> bool:
        """Whether an array made from this window is alive outside the ring."""
        return _counts(self.roots) != self.baseline


class ObservationRing:
    """``count`` generations of gymnasium's shared buffers for ``num_envs`` envs of
    ``space`` (numbered 1 to ``count``; 0 is the store's first buffers), and which of
    them a step may write.

    Args:
        space: The envs' single observation space (a fixed layout whose reads are views).
        num_envs: Number of envs.
        count: Generations to make.

    Raises:
        SharedMemoryFullError: They do not fit in /dev/shm (a ring is then not worth
            file-backed buffers: the store goes without one).
    """

    def __init__(self, space: Space, num_envs: int, count: int = RING_GENERATIONS) -> None:
        self.space, self.num_envs = space, num_envs
        self.buffers: list[Any] = []
        self.segments: list[Any] = []
        try:
            for _ in range(count):
                created = create_observation_buffers(space, num_envs, shm_fallback="error")
                assert created is not None, "a ring for a space without a shared layout"
                self.buffers.append(created[0])
                self.segments.extend(created[1])
        except BaseException:
            self.release()
            raise
        # per generation: its windows, by slice of envs
        self._windows: list[dict[tuple[int, int], _Window]] = [{} for _ in range(count + 1)]
        self._next = 1  # where the search for a free generation starts (round robin)

    @property
    def count(self) -> int:
        """Generations in the ring."""
        return len(self.buffers)

    def acquire(self, envs: slice, busy: set[int]) -> int:
        """A generation for a step of the envs ``envs`` to write: one not in ``busy`` (those
        that steps in flight over these envs write) that no array the caller holds refers
        to for these envs, trying them in turn; 0 where there is none."""
        lo, hi = envs.start, envs.stop
        for k in range(self.count):
            gen = 1 + (self._next - 1 + k) % self.count
            if gen in busy or any(
                w.span[0] < hi and lo < w.span[1] and w.referenced()
                for w in self._windows[gen].values()
            ):
                continue
            self._next = 1 + gen % self.count
            return gen
        return 0

    def views(self, gen: int) -> Any:
        """The whole generation ``gen`` as numpy views (gymnasium's layout), for reading
        rows out of it; the ring does not track these (read them, keep none)."""
        return read_from_shared_memory(self.space, self.buffers[gen - 1], n=self.num_envs)

    def batch(self, gen: int, envs: slice) -> Any:
        """The observations of ``envs`` in generation ``gen``, as views the ring will not
        write again while any array made from them is alive."""
        span = (envs.start, envs.stop)
        window = self._windows[gen].get(span)
        if window is None:
            window = self._windows[gen][span] = _Window(
                self.space, self.buffers[gen - 1], self.num_envs, span
            )
        return batch_slice(self.space, window.tree, envs)

    def release(self) -> None:
        """Drop the ring's own views and release its segments (arrays the caller still
        holds keep their mappings until they are collected)."""
        self._windows = [{} for _ in self._windows] if hasattr(self, "_windows") else []
        self.buffers = []
        release(self.segments)
        self.segments = []


def make_ring(
    space: Space, num_envs: int, nbytes: int, count: int = RING_GENERATIONS
) -> ObservationRing | None:
    """An `ObservationRing` of ``count`` generations of ``nbytes`` each, or None where
    they do not all fit in /dev/shm's free space (logged: steps then copy, as without a
    ring) or the interpreter has no reference counts."""
    if not hasattr(sys, "getrefcount"):
        return None
    free = shm_free_bytes()
    try:
        if free is not None and count * nbytes > free:
            raise SharedMemoryFullError(count * nbytes, free)
        return ObservationRing(space, num_envs, count)
    except OSError as exc:  # SharedMemoryFullError, or ENOSPC from a segment's pages
        logger.info("no observation ring (steps copy their observations): %s", exc)
        return None
