"""Opt-in worker restarts and per-call deadlines."""

from __future__ import annotations

import functools
import logging
from functools import partial

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from pipelined_vec_env import WorkerCrashedError
from pipelined_vec_env.debug_envs import CountingEnv, FaultyEnv

pytestmark = pytest.mark.timeout(120)
F = FaultyEnv


@pytest.fixture
def make_pipelined(make_pipelined):
    """These tests address workers by env (worker k owns env k): one env per worker unless
    a test asks for another layout (the default layout is tested in test_equivalence.py)."""
    return functools.partial(make_pipelined, envs_per_worker=1)


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
    assert info["worker_restarted"][2] and info["_worker_restarted"].tolist() == [
        False,
        False,
        True,
        False,
    ]
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
    envs = make_pipelined(
        [partial(CountingEnv, i, 100) for i in range(2)], num_stages=2, max_restarts=2
    )
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
    restarting = make_pipelined(
        [partial(FaultyEnv, 60.0) for _ in range(2)], step_deadline=0.5, max_restarts=1
    )
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


# ---------------------------------------------------------------------- decoupled mode


def info_row(info, k):
    """Env ``k``'s part of a batched info dict (gymnasium's masks applied)."""
    return {
        key: info_row(v, k) if isinstance(v, dict) else v[k]
        for key, v in info.items()
        if not key.startswith("_") and info[f"_{key}"][k]
    }


def recv_all(envs, count):
    """Receive ``count`` env results; return env id -> (obs, reward, term, trunc, info row)."""
    got = {}
    while len(got) < count:
        obs, rew, term, trunc, info = envs.recv(timeout=30)
        for k, g in enumerate(info["env_id"].tolist()):
            got[g] = (obs[k], float(rew[k]), bool(term[k]), bool(trunc[k]), info_row(info, k))
    assert len(got) == count
    return got


@pytest.mark.parametrize("shared_memory", [True, False])
@pytest.mark.parametrize("bad", [F.SIGKILL, F.RAISE])
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_decoupled_failure_rebuilds_the_worker_and_truncates_its_episodes(
    make_pipelined, caplog, mode, bad, shared_memory
):
    # workers [0, 1] and [2, 3]; env 2 fails while env 3, on the same worker, is not in flight
    envs = make_pipelined(
        [FaultyEnv for _ in range(4)],
        envs_per_worker=2,
        max_restarts=1,
        autoreset_mode=mode,
        shared_memory=shared_memory,
    )
    envs.async_reset(seed=0)
    recv_all(envs, 4)
    envs.send(acts(0, 0, 0, 0), [0, 1, 2, 3])
    recv_all(envs, 4)
    old = envs.workers[1].process
    old_pid = old.pid
    envs.send(acts(0), [3])  # answered before env 2 fails: its result must survive the restart
    envs.send(acts(0, 0, bad), [0, 1, 2])
    if bad == F.SIGKILL:
        old.join(30)  # both answers (and the crash) are in by the next recv
    with caplog.at_level(logging.WARNING, logger="pipelined_vec_env"):
        got = recv_all(envs, 4)
    assert "restarting worker 1" in caplog.text
    assert envs.restart_counts == (0, 1) and envs.workers[1].process.pid != old_pid
    for g in (0, 1, 3):  # untouched, or finished before the failure
        assert got[g][0][0] == 2 and got[g][3] is False and "worker_restarted" not in got[g][4]
    obs2, rew2, term2, trunc2, info2 = got[2]
    assert obs2[0] == 0 and rew2 == 0.0 and not term2 and trunc2 and info2["worker_restarted"]
    if mode == AutoresetMode.SAME_STEP:
        assert info2["final_info"]["worker_restarted"]
    # env 3's simulator went with the old process: its next step ends its episode instead
    envs.send(acts(0, 0), [3, 0])
    got = recv_all(envs, 2)
    assert got[0][0][0] == 3 and not got[0][3]
    obs3, rew3, _, trunc3, info3 = got[3]
    assert obs3[0] == 0 and rew3 == 0.0 and trunc3 and info3["worker_restarted"]
    # then both go on from the fresh reset (NEXT_STEP: first an autoreset step)
    envs.send(acts(0, 0), [2, 3])
    got = recv_all(envs, 2)
    expected = 0 if mode == AutoresetMode.NEXT_STEP else 1
    assert got[2][0][0] == expected and got[3][0][0] == expected
    assert not got[2][3] and not got[3][3]
    # past the bound, the failure is raised as without restarts
    envs.send(acts(bad), [2])
    with pytest.raises((WorkerCrashedError, ValueError)):
        recv_all(envs, 1)


def test_channel_run_survives_a_crashed_simulator(make_pipelined):
    from pipelined_vec_env.stepping.channel import InferenceChannel

    envs = make_pipelined([FaultyEnv for _ in range(3)], max_restarts=1)
    fired = []

    def policy(obs, env_ids):
        actions = np.zeros(len(env_ids), dtype=np.int64)
        for k, (g, count) in enumerate(zip(env_ids.tolist(), obs[:, 0].tolist(), strict=True)):
            if g == 1 and count == 3 and not fired:
                fired.append(g)
                actions[k] = F.SIGKILL
        return actions

    with InferenceChannel(envs, [policy]) as channel:
        channel.reset(seed=0)
        rollout = channel.run(steps_per_env=6, timeout=30)
    assert envs.restart_counts == (0, 1, 0)
    assert rollout.steps.tolist() == [6, 6, 6]
    crashed = rollout.trajectories[1]
    assert crashed.truncations.tolist() == [False, False, False, True, False, False]
    assert crashed.infos[3]["worker_restarted"] and crashed.rewards[3] == 0.0
    assert crashed.obs[:, 0].tolist() == [0, 1, 2, 3, 0, 0]  # truncated, autoreset, then on
    for g in (0, 2):
        assert not rollout.trajectories[g].truncations.any()
        assert rollout.trajectories[g].rewards.tolist() == [1.0] * 6


def test_decoupled_step_deadline_kills_a_hung_worker(make_pipelined):
    envs = make_pipelined([partial(FaultyEnv, 60.0) for _ in range(2)], step_deadline=0.5)
    envs.async_reset(seed=0)
    envs.recv(batch_size=2, timeout=30)
    envs.send(acts(F.SLEEP, 0), [0, 1])
    seen = []
    with pytest.raises(WorkerCrashedError) as info:
        for _ in range(2):  # env 1's result may come before or after the crash report
            seen += envs.recv(timeout=30)[-1]["env_id"].tolist()
    assert info.value.env_indices == (0,) and envs.workers[0].deadline_exceeded
    restarting = make_pipelined(
        [partial(FaultyEnv, 60.0) for _ in range(2)], step_deadline=0.5, max_restarts=1
    )
    restarting.async_reset(seed=0)
    restarting.recv(batch_size=2, timeout=30)
    restarting.send(acts(F.SLEEP, 0), [0, 1])
    got = recv_all(restarting, 2)
    assert got[0][3] and got[0][4]["worker_restarted"] and got[0][0][0] == 0
    assert got[1][0][0] == 1 and not got[1][3]


def test_channel_run_survives_a_hung_simulator(make_pipelined):
    from pipelined_vec_env.stepping.channel import InferenceChannel

    envs = make_pipelined(
        [partial(FaultyEnv, 60.0) for _ in range(2)], step_deadline=0.5, max_restarts=1
    )

    def policy(obs, env_ids):
        hang = (env_ids == 0) & (obs[:, 0] == 2) & (envs.restart_counts[0] == 0)
        return np.where(hang, F.SLEEP, 0).astype(np.int64)

    with InferenceChannel(envs, [policy]) as channel:
        channel.reset(seed=0)
        rollout = channel.run(steps_per_env=5, timeout=30)
    assert envs.restart_counts == (1, 0)
    hung = rollout.trajectories[0]
    assert hung.truncations.tolist() == [False, False, True, False, False]
    assert hung.infos[2]["worker_restarted"]
    assert not rollout.trajectories[1].truncations.any()


class ConcurrentFaultyEnv(FaultyEnv):
    """`FaultyEnv` declared concurrent: decoupled stepping sends its worker one command
    per env, answered as each env finishes."""

    metadata = {**FaultyEnv.metadata, "step_concurrency": "concurrent"}


def test_decoupled_step_deadline_on_a_concurrent_worker_keeps_the_quick_env(make_pipelined):
    # env 1, answered on its own, survives the kill of its worker for env 0's hang
    envs = make_pipelined(
        [partial(ConcurrentFaultyEnv, 60.0) for _ in range(2)],
        envs_per_worker=2,
        step_deadline=0.5,
        max_restarts=1,
    )
    envs.async_reset(seed=0)
    envs.recv(batch_size=2, timeout=30)
    envs.send(acts(F.SLEEP, 0), [0, 1])
    got = recv_all(envs, 2)
    assert envs.workers[0].deadline_exceeded is False and envs.restart_counts == (1,)
    assert got[0][3] and got[0][4]["worker_restarted"] and got[0][0][0] == 0
    assert got[1][0][0] == 1 and not got[1][3] and "worker_restarted" not in got[1][4]
    # without restarts, the hang is raised and the quick env's result still came
    failing = make_pipelined(
        [partial(ConcurrentFaultyEnv, 60.0) for _ in range(2)],
        envs_per_worker=2,
        step_deadline=0.5,
    )
    failing.async_reset(seed=0)
    failing.recv(batch_size=2, timeout=30)
    failing.send(acts(F.SLEEP, 0), [0, 1])
    assert failing.recv(timeout=30)[-1]["env_id"].tolist() == [1]
    with pytest.raises(WorkerCrashedError):
        failing.recv(timeout=30)


@pytest.mark.parametrize("bad", [F.SIGKILL, F.RAISE])
def test_decoupled_failure_of_a_concurrent_worker_truncates_and_goes_on(make_pipelined, bad):
    envs = make_pipelined(
        [ConcurrentFaultyEnv for _ in range(4)], envs_per_worker=2, max_restarts=1
    )
    envs.async_reset(seed=0)
    recv_all(envs, 4)
    envs.send(acts(0, 0, 0, 0), [0, 1, 2, 3])
    recv_all(envs, 4)
    envs.send(acts(0, 0, bad, 0), [0, 1, 2, 3])
    got = recv_all(envs, 4)
    assert envs.restart_counts == (0, 1)
    for g in (0, 1):
        assert got[g][0][0] == 2 and not got[g][3]
    assert got[2][3] and got[2][4]["worker_restarted"]
    # env 3 either stepped before the failure or lost its step to it
    assert got[3][0][0] == 2 or (got[3][3] and got[3][4]["worker_restarted"])
    if got[3][0][0] == 2 and not got[3][3]:  # its simulator is gone: the next step says so
        envs.send(acts(0), [3])
        (obs3, _, _, trunc3, info3) = recv_all(envs, 1)[3]
        assert trunc3 and info3["worker_restarted"]
    # then every env steps on
    ids = list(range(4))
    envs.send(acts(0, 0, 0, 0), ids)
    assert sorted(recv_all(envs, 4)) == ids
