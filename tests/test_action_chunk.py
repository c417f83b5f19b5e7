"""ActionChunk: K actions per step, early stop at episode end, summed reward, per-step info.

Uses CountingEnv (reward = step count + action + env_id / 100; even ids terminate and odd
ids truncate at ``episode_length``) behind a Box->Discrete action transform, so every
reward below can be read off by hand.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import TransformAction

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.debug_envs import CountingEnv
from pipelined_vec_env.wrappers import ActionChunk

K = 4


def make_chunked(env_id: int = 0, episode_length: int = 6) -> ActionChunk:
    env = TransformAction(
        CountingEnv(env_id, episode_length),
        lambda a: int(a[0]),
        action_space=gym.spaces.Box(0, 2, shape=(1,), dtype=np.float32),
    )
    return ActionChunk(env, chunk_size=K)


def chunk(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32).reshape(K, 1)


def test_chunk_runs_in_order_and_stops_at_termination() -> None:
    env = make_chunked(env_id=0, episode_length=6)
    assert env.action_space.shape == (K, 1)
    env.reset(seed=0)

    obs, reward, terminated, truncated, info = env.step(chunk(1, 0, 2, 1))
    # counts 1..4 plus the actions 1, 0, 2, 1
    np.testing.assert_array_equal(info["chunk_rewards"], [2.0, 2.0, 5.0, 5.0])
    assert reward == 14.0 and info["chunk_steps_executed"] == K
    assert obs[1] == 4 and not terminated and not truncated
    assert info["count"] == 4  # the last executed step's info

    obs, reward, terminated, truncated, info = env.step(chunk(2, 2, 2, 2))
    # the episode ends at count 6: two actions run, two are dropped
    np.testing.assert_array_equal(info["chunk_rewards"], [7.0, 8.0, 0.0, 0.0])
    assert reward == 15.0 and info["chunk_steps_executed"] == 2
    assert obs[1] == 6 and terminated and not truncated


def test_chunk_stops_at_truncation_and_checks_shape() -> None:
    env = make_chunked(env_id=1, episode_length=3)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(chunk(0, 0, 0, 0))
    assert info["chunk_steps_executed"] == 3 and truncated and not terminated
    np.testing.assert_allclose(info["chunk_rewards"], [1.01, 2.01, 3.01, 0.0])
    assert reward == pytest.approx(6.03)
    with pytest.raises(ValueError, match="chunk"):
        env.step(np.zeros((K + 1, 1), dtype=np.float32))
    with pytest.raises(TypeError, match="Box"):
        ActionChunk(CountingEnv(), chunk_size=2)


def test_chunks_in_a_staged_vector_env() -> None:
    fns = [lambda i=i: make_chunked(env_id=i, episode_length=6) for i in range(4)]
    envs = PipelinedVectorEnv(fns, num_stages=2)
    try:
        envs.reset(seed=0)
        assert envs.single_action_space.shape == (K, 1)
        for stage, sl in enumerate(envs.stage_slices):
            n = sl.stop - sl.start
            envs.step_async(np.ones((n, K, 1), dtype=np.float32), stage=stage)
        for stage, sl in enumerate(envs.stage_slices):
            _, rewards, _, _, infos = envs.step_wait(stage=stage)
            ids = np.arange(sl.start, sl.stop)
            # counts 1..4, action 1 each, env_id / 100 each step
            np.testing.assert_allclose(rewards, 14.0 + 4 * ids / 100)
            np.testing.assert_array_equal(infos["chunk_steps_executed"], [K] * len(ids))
            assert infos["chunk_rewards"].shape == (len(ids), K)
        _, rewards, terminated, truncated, infos = envs.step(np.ones((4, K, 1), dtype=np.float32))
        np.testing.assert_array_equal(infos["chunk_steps_executed"], [2, 2, 2, 2])
        np.testing.assert_array_equal(terminated, [True, False, True, False])
        np.testing.assert_array_equal(truncated, [False, True, False, True])
    finally:
        envs.close()
