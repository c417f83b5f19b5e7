"""`infos.merge_info` builds gymnasium's batched info layout; `split_infos` inverts it.

The oracle is gymnasium's own vector env merging (`SyncVectorEnv` does it through
`VectorEnv._add_info`): every array, dtype and mask must be the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium.vector import VectorEnv

from pipelined_vec_env.infos import add_env_info, merge_info, split_infos

from .conftest import assert_tree_equal


def gymnasium_merge(per_env: list[dict[str, Any]]) -> dict[str, Any]:
    holder = type("Holder", (), {"num_envs": len(per_env), "_add_info": VectorEnv._add_info})()
    infos: dict[str, Any] = {}
    for i, info in enumerate(per_env):
        infos = holder._add_info(infos, info, i)
    return infos


def ours(per_env: list[dict[str, Any]]) -> dict[str, Any]:
    infos: dict[str, Any] = {}
    for i, info in enumerate(per_env):
        infos = merge_info(infos, info, i, len(per_env))
    return infos


class Level(int):
    """An int subclass: gymnasium keeps it in an object column, not an int one."""


CASES = {
    "python numbers": [{"n": 1, "x": 0.5, "b": True}, {}, {"n": 3, "x": 2.0, "b": False}],
    "numpy numbers and bool_": [
        {"f": np.float32(1.5), "i": np.int8(3), "nb": np.bool_(True)},
        {"f": np.float32(2.5), "nb": np.bool_(False)},
    ],
    "arrays": [{"a": np.arange(3)}, {"a": np.ones(3, dtype=np.int64)}, {}],
    "objects and strings": [{"s": "x", "o": (1, 2)}, {"s": "y"}, {"o": None}],
    "nested dicts": [
        {"d": {"v": 1, "deep": {"w": np.float32(2.0)}}},
        {},
        {"d": {"v": 5}},
    ],
    "final_obs and final_info": [
        {"final_obs": np.arange(2.0), "final_info": {"r": 1.0}},
        {},
        {"final_obs": {"k": np.zeros(1)}, "final_info": {}},
    ],
    "a subclass of int goes to objects": [{"e": Level(4)}, {"e": 7}],
    "a key first written by a later env": [{}, {}, {"late": 2.5}],
}


@pytest.mark.parametrize("name", list(CASES))
def test_merge_info_equals_gymnasium(name):
    per_env = CASES[name]
    assert_tree_equal(ours(per_env), gymnasium_merge(per_env))


def test_merge_info_keeps_the_first_envs_column_dtype():
    # the column is made for the first env that writes the key: a later float goes into ints
    per_env = [{"n": 1}, {"n": 2.7}]
    assert_tree_equal(ours(per_env), gymnasium_merge(per_env))
    assert ours(per_env)["n"].tolist() == [1, 2]


def test_split_infos_inverts_the_merge():
    per_env = [
        {"n": 1, "x": 0.5, "arr": np.arange(2), "nested": {"flag": True}, "obj": "a"},
        {},
        {"n": 3, "nested": {"flag": False, "deep": {"v": np.float32(2.5)}}},
    ]
    assert_tree_equal(split_infos(ours(per_env), 3), per_env)


def test_split_infos_keys_without_a_mask_and_private_keys():
    infos = ours([{"_private": 1}, {}])
    infos["shared"] = "every env"  # not gymnasium's layout: no mask
    assert split_infos(infos, 2) == [
        {"_private": 1, "shared": "every env"},
        {"shared": "every env"},
    ]


def test_add_env_info_serves_both_layouts():
    per_env: list[dict[str, Any]] = [{}, {}]
    assert add_env_info(per_env, {"a": 1}, 1, 2) == [{}, {"a": 1}]
    batched = add_env_info({}, {"a": 1}, 1, 2)
    assert_tree_equal(batched, gymnasium_merge([{}, {"a": 1}]))
