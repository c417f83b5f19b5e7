"""make_vec drop-in and gymnasium.make_vec through our vector entry point."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import pipelined_vec_env
from pipelined_vec_env import PipelinedVectorEnv, make_vec
from tests.conftest import assert_tree_equal


@pytest.fixture
def closing():
    envs = []
    yield envs.append
    for env in envs:
        env.close()


def test_make_vec_matches_gymnasium_make_vec(closing):
    ours = make_vec(
        "CartPole-v1",
        4,
        num_stages=2,
        envs_per_worker=2,
        wrappers=[gym.wrappers.TimeAwareObservation],
    )
    closing(ours)
    ref = gym.make_vec(
        "CartPole-v1", 4, vectorization_mode="sync", wrappers=[gym.wrappers.TimeAwareObservation]
    )
    closing(ref)
    assert isinstance(ours, PipelinedVectorEnv) and ours.num_stages == 2
    assert ours.single_observation_space == ref.single_observation_space
    assert_tree_equal(ours.reset(seed=0), ref.reset(seed=0))
    for _ in range(30):
        a = np.ones(4, dtype=np.int64)
        assert_tree_equal(ours.step(a), ref.step(a))
    rebuilt = make_vec(ours.spec)  # the spec recreates the same vector env
    closing(rebuilt)
    assert (rebuilt.num_envs, rebuilt.num_stages, rebuilt.envs_per_worker) == (4, 2, 2)
    assert rebuilt.single_observation_space == ours.single_observation_space


def test_make_vec_env_kwargs_and_vector_kwargs(closing):
    envs = make_vec(
        "CartPole-v1", 2, max_episode_steps=3, vector_kwargs={"autoreset_mode": "SameStep"}
    )
    closing(envs)
    envs.reset(seed=0)
    for _ in range(2):
        envs.step(np.zeros(2, dtype=np.int64))
    _, _, _, trunc, info = envs.step(np.zeros(2, dtype=np.int64))
    assert trunc.all() and "final_obs" in info
    with pytest.raises(ValueError, match="unknown PipelinedVectorEnv arguments"):
        make_vec("CartPole-v1", 2, vector_kwargs={"stages": 2})


def test_gymnasium_make_vec_returns_pipelined_env_for_registered_id(closing):
    pipelined_vec_env.register(
        "TestPipelinedCartPole-v1",
        entry_point=gym.spec("CartPole-v1").entry_point,
        max_episode_steps=50,
    )
    envs = gym.make_vec("TestPipelinedCartPole-v1", num_envs=4, num_stages=2)
    closing(envs)
    assert isinstance(envs, PipelinedVectorEnv) and envs.stage_slices == (slice(0, 2), slice(2, 4))
    envs.reset(seed=0)
    envs.step_async(np.zeros(2, dtype=np.int64), stage=1)
    assert envs.step_wait(stage=1)[0].shape == (2, 4)
    single = gym.make("TestPipelinedCartPole-v1")
    assert single.spec.max_episode_steps == 50
    single.close()
