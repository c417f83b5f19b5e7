"""`pipelined_vec_env.testing.kill_worker`: a worker killed from outside, for fault tests."""

from __future__ import annotations

import signal
from functools import partial

import numpy as np
import psutil
import pytest
from gymnasium.error import ClosedEnvironmentError

from pipelined_vec_env import WorkerCrashedError
from pipelined_vec_env.debug_envs import CountingEnv
from pipelined_vec_env.testing import kill_worker

pytestmark = pytest.mark.timeout(120)


def _envs(make_pipelined, **kwargs):
    envs = make_pipelined(
        [partial(CountingEnv, i, 100) for i in range(4)], num_stages=2, envs_per_worker=1, **kwargs
    )
    envs.reset(seed=0)
    return envs


def _exited(pid: int) -> bool:
    """The process is gone, or a zombie waiting to be reaped."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_worker_is_gone_on_return_and_its_envs_crash(make_pipelined):
    envs = _envs(make_pipelined)
    victim = envs.workers[3]
    pid = kill_worker(envs, 3)
    assert pid == victim.pid and _exited(pid)
    envs.step_async(np.zeros(2, dtype=np.int64), stage=0)
    obs, *_ = envs.step_wait(stage=0)  # the other stage is untouched
    assert obs[:, 1].tolist() == [1, 1]
    envs.step_async(np.zeros(2, dtype=np.int64), stage=1)
    with pytest.raises(WorkerCrashedError) as info:
        envs.step_wait(stage=1)
    assert info.value.env_indices == victim.env_indices == (3,)
    assert info.value.exitcode == -signal.SIGKILL


def test_sigterm_kills_too_and_the_worker_restarts_within_max_restarts(make_pipelined):
    envs = _envs(make_pipelined, max_restarts=1)
    old = kill_worker(envs, 1, signal.SIGTERM)
    _, _, _, truncs, infos = envs.step(np.zeros(4, dtype=np.int64))
    assert truncs.tolist() == [False, True, False, False]
    assert infos["worker_restarted"].tolist() == [False, True, False, False]
    assert envs.restart_counts == (0, 1, 0, 0) and envs.workers[1].pid != old
    assert not _exited(envs.workers[1].pid)


def test_a_signal_the_worker_ignores_times_out_and_leaves_it_stepping(make_pipelined):
    envs = _envs(make_pipelined)
    with pytest.raises(TimeoutError, match=r"worker 0 .* still runs 0.3 s after SIGINT"):
        kill_worker(envs, 0, signal.SIGINT, timeout=0.3)  # Ctrl-C is the caller's
    obs, *_ = envs.step(np.zeros(4, dtype=np.int64))
    assert obs[:, 1].tolist() == [1, 1, 1, 1]


def test_bad_calls_are_refused_before_any_signal(make_pipelined):
    envs = _envs(make_pipelined)
    pids = [w.pid for w in envs.workers]
    for index in (4, -1, True):
        with pytest.raises(IndexError, match=r"index: expected a worker index in \[0, 4\)"):
            kill_worker(envs, index)
    kill_worker(envs, 2)
    with pytest.raises(RuntimeError, match="worker 2 has exited already"):
        kill_worker(envs, 2)
    assert not any(_exited(pid) for k, pid in enumerate(pids) if k != 2)
    envs.close()
    with pytest.raises(ClosedEnvironmentError):
        kill_worker(envs, 0)
