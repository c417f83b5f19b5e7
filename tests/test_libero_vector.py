"""Two LIBERO envs in a 2-stage PipelinedVectorEnv, built by make_vec from the id (~2 GB)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("libero")

from functools import partial  # noqa: E402

import pipelined_vec_env as pipelined  # noqa: E402
from pipelined_vec_env.libero import LIBERO_ENV_IDS, get_task  # noqa: E402
from pipelined_vec_env.wrappers import ActionChunk  # noqa: E402

K = 3


@pytest.fixture(scope="module")
def envs() -> Iterator[pipelined.PipelinedVectorEnv]:
    envs = pipelined.make_vec(
        LIBERO_ENV_IDS["libero_object"],
        2,
        num_stages=2,
        wrappers=[partial(ActionChunk, chunk_size=K)],
        task_id=1,
    )
    yield envs
    envs.close()


def test_reset_to_ids_then_step_and_reset_per_stage(envs: pipelined.PipelinedVectorEnv) -> None:
    obs, infos = envs.reset(options=[{"init_state_id": 4}, {"init_state_id": 4}])
    np.testing.assert_array_equal(infos["init_state_id"], [4, 4])
    assert list(infos["language_instruction"]) == [get_task("libero_object", 1).language] * 2
    # same init state and settle steps in two processes: identical observations
    np.testing.assert_array_equal(obs["state"][0], obs["state"][1])

    chunk = np.zeros((1, K, 7), dtype=np.float32)
    chunk[..., -1] = -1
    for stage in (0, 1):
        envs.step_async(chunk, stage=stage)
    stepped = [envs.step_wait(stage=stage) for stage in (0, 1)]
    for _, rewards, terminated, truncated, infos in stepped:
        assert rewards.shape == (1,) and not terminated[0] and not truncated[0]
        np.testing.assert_array_equal(infos["chunk_steps_executed"], [K])
        np.testing.assert_array_equal(infos["is_success"], [False])
    np.testing.assert_array_equal(stepped[0][0]["state"], stepped[1][0]["state"])

    # stage 1 alone switches its env to another task of the suite (rebuilds that sim)
    envs.reset_async(options=[{"task_id": 2, "init_state_id": 9}], stage=1)
    obs1, infos1 = envs.reset_wait(stage=1)
    np.testing.assert_array_equal(infos1["init_state_id"], [9])
    np.testing.assert_array_equal(infos1["task_id"], [2])
    assert list(infos1["language_instruction"]) == [get_task("libero_object", 2).language]
    assert not np.array_equal(obs1["state"][0], stepped[1][0]["state"][0])
    assert envs.call("get_wrapper_attr", "init_state_id") == (4, 9)
    assert envs.call("get_wrapper_attr", "task_id") == (1, 2)
