"""Info dicts of many envs: gymnasium's merged layout, and back to one dict per env.

Gymnasium's vector envs return the infos of ``num_envs`` envs as one dict: each key holds
an array over the envs and a boolean mask ``"_key"`` that is True where an env wrote the
key; nested dicts are merged the same way, one level down; ``"final_obs"`` is an object
array (observations of any space). `merge_info` builds that layout (the same arrays,
dtypes and masks as `gymnasium.vector.SyncVectorEnv`, which the equivalence tests
check); `split_infos` turns it back into one dict per env, for the SB3 adapter and for
the inference channel's per-env transitions. `add_env_info` serves both ``info_layout``
settings of the vector env.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["add_env_info", "merge_info", "split_infos"]

# gymnasium batches Python ``int``/``float``/``bool`` info values into arrays of these
# dtypes; items read back from them are returned as Python numbers, as the env wrote them
# (and as SB3's own vector envs pass them through).
_NATIVE_DTYPES = (np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.bool_))


def _new_column(value: Any, num_envs: int) -> np.ndarray:
    """The array that holds key values like ``value`` for ``num_envs`` envs: numbers of
    the value's own type (Python ``int``/``float``/``bool`` exactly, or numpy numbers),
    arrays of its shape and dtype, else objects (None where no env wrote the key)."""
    if type(value) in (int, float, bool) or isinstance(value, np.number):
        return np.zeros(num_envs, dtype=type(value))
    if isinstance(value, np.ndarray):
        return np.zeros((num_envs, *value.shape), dtype=value.dtype)
    return np.full(num_envs, None, dtype=object)


def merge_info(
    infos: dict[str, Any], info: Mapping[str, Any], i: int, num_envs: int
) -> dict[str, Any]:
    """Merge env ``i``'s ``info`` into ``infos``, gymnasium's batched layout over
    ``num_envs`` envs (``infos`` is updated in place and returned).

    Each key ``k`` of ``info`` sets row ``i`` of ``infos[k]`` (an array made at the first
    env that writes ``k``, see `gymnasium.vector.VectorEnv`'s info layout) and of its mask
    ``infos["_k"]``; a dict value is merged one level down; ``"final_obs"`` goes into an
    object array.

    Examples:
        >>> infos = merge_info({}, {"a": 1}, 1, 3)
        >>> infos["a"].tolist(), infos["_a"].tolist()
        ([0, 1, 0], [False, True, False])
    """
    for key, value in info.items():
        if key == "final_obs":  # any observation, kept as the env returned it
            column = infos[key] if key in infos else np.full(num_envs, None, dtype=object)
            column[i] = value
        elif isinstance(value, dict):
            column = merge_info(infos.get(key, {}), value, i, num_envs)
        else:
            column = infos[key] if key in infos else _new_column(value, num_envs)
            column[i] = value
        mask_key = f"_{key}"
        mask = infos[mask_key] if mask_key in infos else np.zeros(num_envs, dtype=np.bool_)
        mask[i] = True
        infos[key], infos[mask_key] = column, mask
    return infos


def add_env_info(infos: Any, info: Mapping[str, Any], i: int, num_envs: int) -> Any:
    """Add env ``i``'s ``info`` to ``infos``: a list of per-env dicts (the vector env's
    ``info_layout="per_env"``; updated in place) or the batched dict (`merge_info`)."""
    if isinstance(infos, list):
        infos[i].update(info)
        return infos
    return merge_info(infos, info, i, num_envs)


def _item(array: np.ndarray, i: int) -> Any:
    if array.ndim == 1:
        value = array[i]
        if array.dtype in _NATIVE_DTYPES:
            return value.item()
        return value
    return array[i].copy()


def split_infos(infos: Mapping[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Turn a gymnasium batched info dict back into one info dict per env.

    The inverse of `merge_info` as far as it can be inverted: a key belongs to env ``i``
    where its ``"_key"`` mask is True; nested dicts are split recursively; arrays of one
    value per env give that env's item (a copy for array values); Python
    ``int``/``float``/``bool`` values, batched as int64/float64/bool, come back as Python
    numbers. A key without a mask (not gymnasium's layout) is shared by every env.

    Args:
        infos: Batched infos from a gymnasium vector env over ``num_envs`` envs.
        num_envs: Number of envs in the batch.

    Returns:
        A list of ``num_envs`` dicts.

    Examples:
        >>> split_infos({"a": np.array([1, 0]), "_a": np.array([True, False])}, 2)
        [{'a': 1}, {}]
    """
    out: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in infos.items():
        mask = infos.get(f"_{key}")
        if mask is None:
            if key.startswith("_") and key[1:] in infos:
                continue  # the mask of ``key[1:]``
            for i in range(num_envs):  # not batched by gymnasium: shared by every env
                out[i][key] = value
            continue
        if isinstance(value, Mapping):
            parts = split_infos(value, num_envs)
            for i in np.flatnonzero(mask):
                out[i][key] = parts[i]
        elif isinstance(value, np.ndarray):
            for i in np.flatnonzero(mask):
                out[i][key] = _item(value, int(i))
        else:
            for i in np.flatnonzero(mask):
                out[i][key] = value[i]
    return out
