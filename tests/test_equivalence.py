"""Everything PipelinedVectorEnv returns equals gymnasium's SyncVectorEnv on the same envs.

Envs have different episode lengths so every autoreset path is crossed; stages are
stepped in varying orders and the per-stage results are compared with the matching
slices of SyncVectorEnv's whole-batch results.
"""

from __future__ import annotations

import os
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from pipelined_vec_env.batching import batch_slice
from pipelined_vec_env.debug_envs import CountingEnv
from tests.conftest import assert_tree_equal, slice_infos

NUM_ENVS = 6
LENGTHS = [2, 3, 4, 5, 3, 2]


def env_fns(kind: str = "box") -> list:
    return [partial(CountingEnv, i, LENGTHS[i], kind) for i in range(NUM_ENVS)]


def done_mask(term: np.ndarray, trunc: np.ndarray) -> np.ndarray:
    return np.logical_or(term, trunc)


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize(
    "num_stages,envs_per_worker", [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)]
)
def test_whole_env_calls_match_sync(make_pipelined, mode, num_stages, envs_per_worker):
    ours = make_pipelined(
        env_fns(), num_stages=num_stages, envs_per_worker=envs_per_worker, autoreset_mode=mode
    )
    ref = gym.vector.SyncVectorEnv(env_fns(), autoreset_mode=mode)
    try:
        assert_tree_equal(ours.reset(seed=3), ref.reset(seed=3))
        rng = np.random.default_rng(0)
        for _ in range(14):
            actions = rng.integers(0, 3, size=NUM_ENVS)
            got, want = ours.step(actions), ref.step(actions)
            assert_tree_equal(got, want)
            if mode == AutoresetMode.DISABLED:
                done = done_mask(want[2], want[3])
                if done.any():
                    assert_tree_equal(
                        ours.reset(options={"reset_mask": done.copy()}),
                        ref.reset(options={"reset_mask": done.copy()}),
                    )
    finally:
        ref.close()


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("num_stages", [2, 4])
def test_stage_calls_in_varying_orders_match_sync(make_pipelined, mode, num_stages):
    ours = make_pipelined(env_fns(), num_stages=num_stages, envs_per_worker=2, autoreset_mode=mode)
    ref = gym.vector.SyncVectorEnv(env_fns(), autoreset_mode=mode)
    space = ours.single_observation_space
    rng = np.random.default_rng(1)
    try:
        obs, infos = ref.reset(seed=[10 + i for i in range(NUM_ENVS)])
        for s in range(num_stages):
            ours.reset_async(seed=10, stage=s)  # env i gets 10 + i whatever the stage
        for s in rng.permutation(num_stages):
            got_obs, got_infos = ours.reset_wait(stage=int(s))
            envs = ours.stage_slices[s]
            assert_tree_equal(got_obs, batch_slice(space, obs, envs))
            assert_tree_equal(got_infos, slice_infos(infos, envs))
        for _ in range(12):
            actions = rng.integers(0, 3, size=NUM_ENVS)
            want = ref.step(actions)
            for s in rng.permutation(num_stages):
                envs = ours.stage_slices[s]
                ours.step_async(actions[envs], stage=int(s))
            for s in rng.permutation(num_stages):
                envs = ours.stage_slices[s]
                got = ours.step_wait(stage=int(s))
                assert_tree_equal(got[0], batch_slice(space, want[0], envs))
                for part in (1, 2, 3):
                    assert_tree_equal(got[part], want[part][envs])
                assert_tree_equal(got[4], slice_infos(want[4], envs))
            done = done_mask(want[2], want[3])
            if mode == AutoresetMode.DISABLED and done.any():
                ref_reset = ref.reset(options={"reset_mask": done.copy()})
                for s, envs in enumerate(ours.stage_slices):
                    if done[envs].any():
                        ours.reset_async(options={"reset_mask": done[envs].copy()}, stage=s)
                        got_obs, got_infos = ours.reset_wait(stage=s)
                        assert_tree_equal(got_obs, batch_slice(space, ref_reset[0], envs))
                        assert_tree_equal(got_infos, slice_infos(ref_reset[1], envs))
    finally:
        ref.close()


@pytest.mark.parametrize("kind", ["dict", "text", "sequence"])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_nested_and_non_shared_spaces_match_sync(make_pipelined, kind, mode):
    ours = make_pipelined(env_fns(kind), num_stages=2, envs_per_worker=2, autoreset_mode=mode)
    ref = gym.vector.SyncVectorEnv(env_fns(kind), autoreset_mode=mode)
    try:
        assert ours.observation_space == ref.observation_space
        assert_tree_equal(ours.reset(seed=5), ref.reset(seed=5))
        for t in range(9):
            actions = np.full(NUM_ENVS, t % 3)
            assert_tree_equal(ours.step(actions), ref.step(actions))
    finally:
        ref.close()


def test_pipe_only_matches_shared_memory(make_pipelined):
    shm = make_pipelined(env_fns("dict"), num_stages=2)
    pipe = make_pipelined(env_fns("dict"), num_stages=2, shared_memory=False)
    assert_tree_equal(shm.reset(seed=1), pipe.reset(seed=1))
    for t in range(7):
        actions = np.full(NUM_ENVS, t % 3)
        assert_tree_equal(shm.step(actions), pipe.step(actions))


def test_observation_mode_different(make_pipelined):
    def make(high):
        def fn():
            env = CountingEnv(0, 3)
            env.observation_space = gym.spaces.Box(-high, high, shape=(3,), dtype=np.float64)
            return env

        return fn

    fns = [make(10.0), make(20.0), make(30.0)]
    with pytest.raises(RuntimeError, match="observation_mode='different'"):
        make_pipelined(fns, num_stages=1)
    ours = make_pipelined(fns, num_stages=3, observation_mode="different")
    ref = gym.vector.SyncVectorEnv(fns, observation_mode="different")
    assert ours.observation_space == ref.observation_space
    assert_tree_equal(ours.reset(seed=0), ref.reset(seed=0))
    assert_tree_equal(ours.step(np.ones(3, dtype=np.int64)), ref.step(np.ones(3, dtype=np.int64)))
    ref.close()


@pytest.mark.parametrize(
    "num_envs,num_stages,cores,expected",
    [
        (8, 1, 2, 4),
        (32, 2, 2, 8),
        (4, 1, 16, 1),
        (5, 1, 2, 3),
        (3, 3, 1, 1),
        (7, 2, 4, 1),
        (8, 2, 2, 2),
    ],
)
def test_default_envs_per_worker_is_one_worker_per_core_per_stage(
    num_envs, num_stages, cores, expected
):
    from pipelined_vec_env import default_envs_per_worker

    assert default_envs_per_worker(num_envs, num_stages, cores=cores) == expected


def _holds(env: gym.Env) -> tuple[int, int]:
    """The worker's pid and the identity of the object the env was built with."""
    return os.getpid(), id(env.unwrapped.held)


class HoldingEnv(CountingEnv):
    """`CountingEnv` that keeps the object it was built with."""

    def __init__(self, env_id: int, held: object) -> None:
        super().__init__(env_id, 10)
        self.held = held


def test_envs_of_one_worker_share_no_object_their_constructors_hold(make_pipelined):
    """Constructors that hold one object (a space, a config) give each env of a worker its
    own copy, as separate processes would: envs stepped on threads share nothing."""
    shared = {"a": [1, 2, 3]}
    envs = make_pipelined([partial(HoldingEnv, i, shared) for i in range(4)], envs_per_worker=4)
    held = envs.call_at(list(range(4)), _holds)
    assert len({pid for pid, _ in held}) == 1  # one worker
    assert len({ident for _, ident in held}) == 4  # four objects


@pytest.mark.parametrize("layout", [{}, {"envs_per_worker": 1}, {"envs_per_worker": 3}])
def test_same_seeds_give_same_trajectories_whatever_the_layout(make_pipelined, layout):
    fns = [partial(gym.make, "Pendulum-v1") for _ in range(NUM_ENVS)]
    ours = make_pipelined(fns, num_stages=2, **layout)
    ref = gym.vector.SyncVectorEnv(fns)
    try:
        assert_tree_equal(ours.reset(seed=5), ref.reset(seed=5))
        rng = np.random.default_rng(2)
        for _ in range(20):
            actions = rng.uniform(-2, 2, size=(NUM_ENVS, 1)).astype(np.float32)
            assert_tree_equal(ours.step(actions), ref.step(actions))
    finally:
        ref.close()
