"""Stage-aware RecordEpisodeStatistics matches gymnasium's on whole-env and stage calls."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from pipelined_vec_env.debug_envs import CountingEnv
from pipelined_vec_env.wrappers.episode_statistics import RecordEpisodeStatistics

LENGTHS = [2, 3, 4, 5]


def fns():
    return [partial(CountingEnv, i, LENGTHS[i]) for i in range(4)]


def episodes(info):
    if "episode" not in info:
        return {}
    return {
        int(i): (float(info["episode"]["r"][i]), int(info["episode"]["l"][i]))
        for i in np.flatnonzero(info["_episode"])
    }


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_stage_calls_record_the_same_episodes_as_gymnasium(make_pipelined, mode):
    ours = RecordEpisodeStatistics(make_pipelined(fns(), num_stages=2, autoreset_mode=mode))
    ref = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv(fns(), autoreset_mode=mode)
    )
    ours.reset(seed=0)
    ref.reset(seed=0)
    rng = np.random.default_rng(0)
    seen = 0
    for t in range(15):
        actions = rng.integers(0, 3, size=4)
        want = episodes(ref.step(actions)[4])
        got = {}
        if t % 3 == 0:
            got = episodes(ours.step(actions)[4])
        else:
            for s in (1, 0):
                ours.step_async(actions[ours.stage_slices[s]], stage=s)
            for s in (0, 1):
                offset = ours.stage_slices[s].start
                got.update({offset + i: v for i, v in episodes(ours.step_wait(stage=s)[4]).items()})
        assert got == want
        seen += len(got)
    assert seen >= 8
    assert list(ours.return_queue) == list(ref.return_queue)
    assert list(ours.length_queue) == list(ref.length_queue)
    ref.close()


def test_stage_reset_restarts_only_that_stage(make_pipelined):
    envs = RecordEpisodeStatistics(
        make_pipelined([partial(CountingEnv, i, 10) for i in range(4)], num_stages=2)
    )
    envs.reset(seed=0)
    envs.step(np.zeros(4, dtype=np.int64))
    envs.reset_async(stage=1)
    envs.reset_wait(stage=1)
    np.testing.assert_array_equal(envs.episode_lengths, [1, 1, 0, 0])
