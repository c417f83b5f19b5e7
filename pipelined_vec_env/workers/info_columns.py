"""Scalar infos as columns: the fast path's encoding of the envs' info dicts.

A worker whose envs return the same plain scalar info keys every step learns an
`InfoLayout` (the keys, in order, and their exact types); while later steps match it, the
infos travel as columns of ``int64`` / ``float64`` cells in the worker's shared-memory slot
(`slots.StepSlot`) instead of being pickled. In the caller one answer's columns are a
`ColumnInfos`, which reads like the pickled infos and merges into gymnasium's batched info
layout; `join_column_infos` and `batched_infos` build that layout for many envs at once,
one copy per key. See docs/wire_format.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..infos import merge_info

__all__ = [
    "CELL_TYPES",
    "MAX_INFO_COLUMNS",
    "ColumnInfos",
    "InfoLayout",
    "all_true",
    "batched_infos",
    "join_column_infos",
]

#: Most scalar info keys the info cells hold.
MAX_INFO_COLUMNS = 16

#: The exact scalar types an info column may hold, and how a cell stores them (``"f"``:
#: float64, ``"i"``: int64).
CELL_TYPES: dict[type, str] = {
    float: "f",
    np.float64: "f",
    np.float32: "f",
    np.float16: "f",
    int: "i",
    np.int64: "i",
    np.int32: "i",
    np.int16: "i",
    np.int8: "i",
    np.uint32: "i",
    np.uint16: "i",
    np.uint8: "i",
    bool: "i",
}
# (np.bool_ is not among them: it is no np.number, so gymnasium batches it in an object
# array filled with None, which the columns do not rebuild)


class InfoLayout:
    """The scalar info keys a worker's envs return every step, in order, with their types.

    Learned by the worker from one step whose every env returned one info dict of plain
    scalars (`float`, `int`, `bool`, numpy scalars) with the same keys in the same order;
    while later steps match it exactly (keys, order, types), their infos travel as
    columns of the slot's info cells instead of being pickled.

    Attributes:
        keys: The info keys, in the envs' order.
        types: The exact type of each key's values (rebuilt as such in the caller).
        mask_keys: ``"_key"`` for each key (gymnasium's mask of that key).
        dtypes: ``np.dtype`` of each type (the batched array's dtype).
        floats: Per key, whether its cells hold ``float64`` (else ``int64``).
        batch_keys: The batched infos' keys in gymnasium's order (each key, then its mask).
        cell_dtype: ``float64`` or ``int64`` when every key's cells are of that one kind,
            else None (mixed).
        casts: Per key, its dtype where it differs from ``cell_dtype``, else None.
        cast_columns: The indices of the keys with a cast.
    """

    __slots__ = (
        "batch_keys",
        "cast_columns",
        "casts",
        "cell_dtype",
        "dtypes",
        "floats",
        "keys",
        "mask_keys",
        "types",
    )

    def __init__(self, keys: tuple[str, ...], types: tuple[type, ...]) -> None:
        self.keys = keys
        self.types = types
        # derived once, used at every step
        self.mask_keys = tuple(f"_{key}" for key in keys)
        self.dtypes = tuple(np.dtype(t) for t in types)
        self.floats = tuple(CELL_TYPES.get(t) == "f" for t in types)
        #: gymnasium's batched infos' key order: each key, then its mask
        self.batch_keys = tuple(k for pair in zip(keys, self.mask_keys, strict=True) for k in pair)
        #: the one kind of every key's cells, or None (mixed)
        self.cell_dtype = (
            None
            if len(set(self.floats)) != 1
            else np.dtype(np.float64 if self.floats[0] else np.int64)
        )
        self.casts = tuple(None if d == self.cell_dtype else d for d in self.dtypes)
        #: the columns whose dtype is not the cells'
        self.cast_columns = tuple(c for c, cast in enumerate(self.casts) if cast is not None)

    @classmethod
    def learn(cls, infos: list[list[dict]]) -> InfoLayout | None:
        """The layout ``infos`` (one list of info dicts per env) fits, or None."""
        if not infos or len(infos[0]) != 1:
            return None
        first = infos[0][0]
        if not first or len(first) > MAX_INFO_COLUMNS:
            return None
        keys = tuple(first)
        types = tuple(type(v) for v in first.values())
        if not all(t in CELL_TYPES for t in types):
            return None
        layout = cls(keys, types)
        return layout if layout.fits(infos) else None

    def fits(self, infos: list[list[dict]]) -> bool:
        """Whether every env returned one info dict with exactly these keys and types."""
        return self.rows(infos) is not None

    def rows(self, infos: list[list[dict]]) -> list[tuple] | None:
        """Each env's info values in key order, if ``infos`` fit the layout (`fits`),
        else None."""
        keys, types = self.keys, self.types
        rows = []
        for env_infos in infos:
            if len(env_infos) != 1:
                return None
            info = env_infos[0]
            values = tuple(info.values())
            # exact types: a subclass (np.bool_ is no bool) does not fit
            if tuple(info) != keys or tuple(map(type, values)) != types:
                return None
            rows.append(values)
        return rows

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return InfoLayout, (self.keys, self.types)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, InfoLayout) and self.keys == other.keys and self.types == other.types
        )

    def __hash__(self) -> int:
        return hash((self.keys, self.types))


class ColumnInfos:
    """The infos of one fast step answer: ``values[c][k]`` is env ``k``'s value of
    ``layout.keys[c]`` (no layout: every env's info is empty).

    Reads like the pickled answer's infos (``infos[k]`` is env ``k``'s list of info
    dicts, rebuilt with the values' own types) and merges straight into gymnasium's
    batched layout with `merge_into`.
    """

    __slots__ = ("_values", "block", "layout", "n")

    def __init__(
        self,
        layout: InfoLayout | None,
        values: list[np.ndarray] | None,
        n: int,
        block: np.ndarray | None = None,
    ) -> None:
        self.layout = layout
        self._values = values
        self.n = n
        #: ``(len(layout.keys), n)``: every column at once, where the layout's cells are of
        #: one kind (``values`` are then its rows, made when first read), else None
        self.block = block

    @property
    def values(self) -> list[np.ndarray]:
        """One array per key of the layout: ``values[c][k]`` is env ``k``'s value."""
        if self._values is None:
            self._values = [] if self.block is None else list(self.block)
        return self._values

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> list[dict[str, Any]]:
        if k < 0:
            k += self.n
        if not 0 <= k < self.n:
            raise IndexError(k)
        if self.layout is None:
            return [{}]
        return [
            {
                key: t(column[k].item())
                for key, t, column in zip(
                    self.layout.keys, self.layout.types, self.values, strict=True
                )
            }
        ]

    def __iter__(self) -> Any:
        return (self[k] for k in range(self.n))

    def merge_into(self, infos: dict[str, Any], lo: int, num_envs: int) -> dict[str, Any]:
        """Merge these envs' infos into gymnasium's batched ``infos`` of ``num_envs``
        envs, these envs at positions ``lo, lo + 1, ...``.

        The same result as gymnasium's ``VectorEnv._add_info`` env by env (an array per
        key of ``dtype=type(value)``, created on first sight, and a ``_key`` bool mask;
        an existing array keeps its dtype), in one slice assignment per key.
        """
        layout = self.layout
        if layout is None:
            return infos
        hi = lo + self.n
        for key, mask_key, t, dtype, column in zip(
            layout.keys, layout.mask_keys, layout.types, layout.dtypes, self.values, strict=True
        ):
            array = infos.get(key)
            if array is None:
                array = infos[key] = np.zeros(num_envs, dtype=dtype)
            elif not isinstance(array, np.ndarray) or array.ndim != 1:
                # an earlier worker put something else under this key: gymnasium's rules
                for k in range(self.n):
                    infos = _add_one(infos, key, t(column[k].item()), lo + k, num_envs)
                continue
            # the cells hold exactly the env's values (float64 / int64 represent every
            # value of the cell types): one cast into the batched array's dtype
            array[lo:hi] = column
            mask = infos.get(mask_key)
            if mask is None:
                mask = infos[mask_key] = np.zeros(num_envs, dtype=np.bool_)
            mask[lo:hi] = True
        return infos


def batched_infos(layout: InfoLayout, values: np.ndarray, masks: np.ndarray) -> dict[str, Any]:
    """gymnasium's batched infos of one layout from ``values`` (a row per key, in the cells' dtype) and
    ``masks`` (a row per key)."""
    rows = list(values)
    for c in layout.cast_columns:
        rows[c] = rows[c].astype(layout.casts[c])
    return dict(zip(layout.batch_keys, _interleave(rows, list(masks)), strict=True))


_ALL_TRUE: dict[tuple[int, ...], np.ndarray] = {}


def all_true(shape: tuple[int, ...]) -> np.ndarray:
    """A fresh all-True bool array of ``shape`` (a copy of a kept one: ``np.ones`` costs
    more)."""
    template = _ALL_TRUE.get(shape)
    if template is None:
        template = _ALL_TRUE[shape] = np.ones(shape, dtype=np.bool_)
    return template.copy()


def _interleave(a: list, b: list) -> list:
    """``a[0], b[0], a[1], b[1], ...`` (``a`` and ``b`` of one length)."""
    out = a + b
    out[::2], out[1::2] = a, b
    return out


def join_column_infos(parts: Sequence[ColumnInfos]) -> dict[str, Any] | None:
    """gymnasium's batched infos of the envs of ``parts`` (answers' `ColumnInfos`, their
    envs end to end), as `read_step` makes them: one copy per key. None (nothing made)
    unless every part's infos are empty, or every part holds one block of cells under one
    layout of one cell kind; merge them one by one then (`ColumnInfos.merge_into`)."""
    layouts = [p.layout for p in parts]
    layout = layouts[0]
    if layout is None:
        return {} if all(x is None for x in layouts) else None
    if layout.cell_dtype is None:
        return None
    for p in parts:
        if p.block is None or (p.layout is not layout and p.layout != layout):
            return None
    values = parts[0].block if len(parts) == 1 else np.concatenate([p.block for p in parts], 1)
    n = values.shape[1]
    return batched_infos(layout, values, all_true((len(layout.keys), n)))


def _add_one(infos: dict[str, Any], key: str, value: Any, i: int, num_envs: int) -> dict[str, Any]:
    return merge_info(infos, {key: value}, i, num_envs)
