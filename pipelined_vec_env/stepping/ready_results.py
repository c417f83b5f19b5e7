"""Decoupled stepping's results between an answer and the ``recv`` that returns them.

Each answer's results stay together (`ReadyResults`) until ``recv`` joins them into one
batch in gymnasium's layout: arrays end to end, infos batched as gymnasium's vector envs
batch them (`joined_infos`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..batching import batch_slice
from ..infos import merge_info
from ..workers.slots import ColumnInfos, join_column_infos

__all__ = ["ReadyResults", "joined", "joined_infos", "rows_of"]


class ReadyResults:
    """The results of some envs that arrived and were not returned by ``recv`` yet (one
    answer's, as the worker sent them).

    Attributes:
        ids: Global env ids, in the answer's order.
        items: One observation item per env, or None (they are in the shared store).
        rewards: ``(len(ids),)`` rewards (float64 once joined).
        terminations: ``(len(ids),)`` termination flags.
        truncations: ``(len(ids),)`` truncation flags.
        infos: Per env its list of info dicts (a `ColumnInfos` for a fast step answer).
    """

    __slots__ = ("ids", "infos", "items", "rewards", "terminations", "truncations")

    def __init__(
        self,
        ids: list[int],
        items: Sequence[Any] | None,
        rewards: Any,
        terminations: Any,
        truncations: Any,
        infos: Any,
    ) -> None:
        self.ids, self.items, self.infos = ids, items, infos
        self.rewards, self.terminations, self.truncations = rewards, terminations, truncations


def joined_infos(chunks: list[ReadyResults], n: int) -> dict[str, Any]:
    """gymnasium's batched infos of the ``n`` envs of ``chunks``, end to end."""
    if all(type(c.infos) is ColumnInfos for c in chunks):
        batched = join_column_infos([c.infos for c in chunks])
        if batched is not None:  # one layout of one cell kind: one copy per key
            return batched
    infos: dict[str, Any] = {}
    lo = 0
    for c in chunks:
        if type(c.infos) is ColumnInfos:  # one slice assignment per key
            infos = c.infos.merge_into(infos, lo, n)
        else:
            for k, env_infos in enumerate(c.infos):
                for info in env_infos:
                    infos = merge_info(infos, info, lo + k, n)
        lo += len(c.ids)
    return infos


def joined(parts: list[Any], dtype: Any) -> np.ndarray:
    """``parts`` (arrays or sequences) joined end to end into one new array of ``dtype``."""
    if len(parts) == 1:
        return np.array(parts[0], dtype=dtype)  # a copy: the part may be a kept array
    return np.concatenate([np.asarray(p) for p in parts]).astype(dtype, copy=False)


def rows_of(space: Any, batch: Any, positions: list[int]) -> Any:
    """The rows ``positions`` of a batch (copies for arrays; tuples for item batches)."""
    return batch_slice(space, batch, np.asarray(positions, dtype=np.int64))
