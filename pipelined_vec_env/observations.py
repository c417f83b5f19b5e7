"""The observations of a vector env's envs: where they live, how they are read and copied.

With shared memory (the space has a fixed layout and the backend is local) the workers
write each env's observation into gymnasium's buffers (`shared_memory`) and answers carry
none; otherwise each answer carries the observations as items, kept here per env. Either
way the vector env, stage stepping and decoupled stepping read batches, single items and
copies through one `ObservationStore`.
"""

from __future__ import annotations

import logging
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

from .batching import batch_slice
from .shared_memory import create_observation_buffers, release

__all__ = ["ObservationStore"]

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

    Attributes:
        buffers: gymnasium's shared memory buffers for the workers to write into
            (`WorkerPool.attach` hands them on), or None.
        segments: The shared memory segments behind ``buffers`` (released by `release`).
    """

    def __init__(
        self, space: Space, num_envs: int, shared: bool, shm_fallback: str = "file"
    ) -> None:
        self.space = space
        self.num_envs = num_envs
        self.buffers: Any = None
        self.segments: list[Any] = []
        self._items: list[Any] = [None] * num_envs
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
        # a single numeric array (Box, Discrete, ...): `batch` slices and copies it directly
        self._array = isinstance(self._view, np.ndarray) and self._view.dtype != object

    @property
    def shared(self) -> bool:
        """Observations live in shared memory (answers carry none)."""
        return self.buffers is not None

    def keep(self, g: int, item: Any) -> None:
        """Remember ``item`` (from an answer) as env ``g``'s latest observation."""
        self._items[g] = item

    def write(self, g: int, item: Any) -> None:
        """Write ``item`` as env ``g``'s observation into shared memory."""
        write_to_shared_memory(self.space, g, item, self.buffers)

    def single(self, g: int) -> Any:
        """A copy of env ``g``'s observation in shared memory, as a single item."""
        return _first(
            self.space, deepcopy(batch_slice(self.space, self._shared(), slice(g, g + 1)))
        )

    def rows(self, ids: np.ndarray) -> Any:
        """A batch (copies) of the observations in shared memory of the envs ``ids``."""
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

    def release(self) -> None:
        """Drop the views and unlink the shared memory segments (after the workers stop)."""
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
