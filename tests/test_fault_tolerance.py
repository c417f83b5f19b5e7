"""Opt-in worker restarts and per-call deadlines."""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from pipelined_vec_env import WorkerCrashedError
from pipelined_vec_env.debug_envs import CountingEnv, FaultyEnv

pytestmark = pytest.mark.timeout(120)
F = FaultyEnv


def acts(*values):
    return np.array(values, dtype=np.int64)


@pytest.mark.parametrize("bad", [F.SIGKILL, F.EXIT, F.RAISE])
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_failed_worker_is_rebuilt_and_its_episodes_truncated(make_pipelined, caplog, bad, mode):
    envs = make_pipelined(
        [partial(FaultyEnv) for _ in range(4)], num_stages=2, max_restarts=1, autoreset_mode=mode
    )
    envs.reset(seed=0)
    envs.step(acts(0, 0, 0, 0))
    old_pid = envs.stages[1].workers[0].process.pid
    with caplog.at_level(logging.WARNING, logger="pipelined_vec_env"):
        obs, rew, term, trunc, info = envs.step(acts(0, 0, bad, 0))
    assert "restarting worker 2" in caplog.text
    np.testing.assert_array_equal(trunc, [False, False, True, False])
    np.testing.assert_array_equal(obs[:, 0], [2, 2, 0, 2])  # env 2 starts over
    assert info["worker_restarted"][2] and info["_worker_restarted"].tolist() == [False, False, True, False]
    if mode == AutoresetMode.SAME_STEP:
        assert info["_final_obs"].tolist() == [False, False, True, False]
    assert envs.restart_counts == (0, 0, 1, 0)
    assert envs.stages[1].workers[0].process.pid != old_pid
    if mode == AutoresetMode.DISABLED:
        envs.reset(options={"reset_mask": trunc})
    obs, rew, term, trunc, info = envs.step(acts(0, 0, 0, 0))
    expected_env2 = 0 if mode == AutoresetMode.NEXT_STEP else 1  # NEXT_STEP: an autoreset step
    np.testing.assert_array_equal(obs[:, 0], [3, 3, expected_env2, 3])
    # the bound: a second failure of the same worker is raised
    with pytest.raises((WorkerCrashedError, ValueError)):
        envs.step(acts(0, 0, bad, 0))


def test_failure_during_stage_step_restarts_only_that_worker(make_pipelined):
    envs = make_pipelined([partial(CountingEnv, i, 100) for i in range(2)], num_stages=2, max_restarts=2)
    envs.reset(seed=0)
    envs.step_async(acts(0), stage=0)
    victim = envs.stages[1].workers[0]
    victim.process.kill()
    victim.process.join()
    envs.step_async(acts(0), stage=1)
    obs1, _, _, trunc1, info1 = envs.step_wait(stage=1)
    obs0, _, _, trunc0, _ = envs.step_wait(stage=0)
    assert trunc1.tolist() == [True] and trunc0.tolist() == [False]
    assert obs0[0, 1] == 1 and obs1[0, 1] == 0
    assert envs.restart_counts == (0, 1)


def test_step_deadline_kills_a_hung_worker(make_pipelined):
    envs = make_pipelined([partial(FaultyEnv, 60.0) for _ in range(2)], step_deadline=0.5)
    envs.reset(seed=0)
    with pytest.raises(WorkerCrashedError) as info:
        envs.step(acts(F.SLEEP, 0))
    assert info.value.env_indices == (0,)
    restarting = make_pipelined([partial(FaultyEnv, 60.0) for _ in range(2)], step_deadline=0.5, max_restarts=1)
    restarting.reset(seed=0)
    _, _, _, trunc, info = restarting.step(acts(F.SLEEP, 0))
    assert trunc.tolist() == [True, False] and info["worker_restarted"][0]


def test_reset_failure_is_restarted_too(make_pipelined):
    class ResetOnceFails(CountingEnv):

        def reset(self, *, seed=None, options=None):
            if options and options.get("boom"):
                raise RuntimeError("reset failed")
            return super().reset(seed=seed, options=options)

    envs = make_pipelined([partial(ResetOnceFails, i) for i in range(2)], max_restarts=1)
    obs, info = envs.reset(seed=0, options=[None, {"boom": True}])
    assert info["worker_restarted"].tolist() == [False, True]


def test_bad_restart_arguments():
    from pipelined_vec_env import PipelinedVectorEnv

    with pytest.raises(ValueError, match="max_restarts"):
        PipelinedVectorEnv([CountingEnv], max_restarts=-1)
    with pytest.raises(ValueError, match="step_deadline"):
        PipelinedVectorEnv([CountingEnv], step_deadline=0)
