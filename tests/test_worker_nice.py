"""``worker_nice``: the workers' nice value, set inside each worker at start-up and restarts."""

from __future__ import annotations

import os
import signal

import gymnasium as gym
import numpy as np
import pytest

import pipelined_vec_env
from pipelined_vec_env import PipelinedVectorEnv, make_vec
from pipelined_vec_env.debug_envs import BusyEnv

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not hasattr(os, "setpriority"), reason="needs os.setpriority"),
]


def _nice(env: gym.Env) -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def _pid(env: gym.Env) -> int:
    return os.getpid()


def _busy() -> BusyEnv:
    return BusyEnv(step_seconds=0.0, obs_dim=3, action_dim=2, episode_length=100)


def test_worker_nice_is_set_in_every_worker_and_after_a_restart(make_pipelined):
    base = os.getpriority(os.PRIO_PROCESS, 0)
    nice = min(19, base + 3)
    envs = make_pipelined(
        [_busy] * 4, num_stages=2, envs_per_worker=2, worker_nice=nice, max_restarts=1
    )
    assert envs.worker_nice == nice
    assert envs.call_at(range(4), _nice) == (nice,) * 4  # absolute: 2 envs do not stack
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the caller keeps its own
    envs.reset(seed=0)
    (pid,) = envs.call_at([0], _pid)
    os.kill(pid, signal.SIGKILL)
    _, _, _, trunc, info = envs.step(np.zeros((4, 2), dtype=np.float32))
    assert trunc[:2].all() and info["worker_restarted"][:2].all()
    assert envs.call_at([0], _pid) != (pid,)
    assert envs.call_at(range(4), _nice) == (nice,) * 4  # the fresh worker too


def _policy(env: gym.Env) -> int:
    return os.sched_getscheduler(0)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
def test_idle_puts_every_worker_in_sched_idle_and_again_after_a_restart(make_pipelined):
    envs = make_pipelined([_busy] * 2, num_stages=2, worker_nice="idle", max_restarts=1)
    assert envs.worker_nice == "idle"
    assert envs.call_at(range(2), _policy) == (os.SCHED_IDLE,) * 2
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller keeps its own
    envs.reset(seed=0)
    (pid,) = envs.call_at([1], _pid)
    os.kill(pid, signal.SIGKILL)
    envs.step(np.zeros((2, 2), dtype=np.float32))
    assert envs.call_at(range(2), _policy) == (os.SCHED_IDLE,) * 2


def test_default_leaves_the_inherited_nice_value(make_pipelined):
    envs = make_pipelined([_busy] * 2)
    assert envs.worker_nice is None
    assert envs.call_at(range(2), _nice) == (os.getpriority(os.PRIO_PROCESS, 0),) * 2


def test_make_vec_and_gymnasium_make_vec_pass_worker_nice():
    nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 2)
    envs = make_vec("CartPole-v1", 2, vector_kwargs={"worker_nice": nice})
    try:
        assert envs.call_at(range(2), _nice) == (nice,) * 2
    finally:
        envs.close()
    pipelined_vec_env.register(
        "TestNicedCartPole-v1", entry_point=gym.spec("CartPole-v1").entry_point
    )
    envs = gym.make_vec("TestNicedCartPole-v1", num_envs=2, worker_nice=nice)
    try:
        assert isinstance(envs, PipelinedVectorEnv)
        assert envs.call_at(range(2), _nice) == (nice,) * 2
    finally:
        envs.close()


@pytest.mark.parametrize("bad", [20, -21, 1.5, True, "5", "IDLE"])
def test_bad_worker_nice_is_refused_before_any_worker_starts(bad):
    def never() -> gym.Env:
        raise AssertionError("no worker may start")

    with pytest.raises(
        ValueError, match=r"worker_nice: expected None, 'idle' or an int in \[-20, 19\]"
    ):
        PipelinedVectorEnv([never], worker_nice=bad)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may raise its priority")
def test_raising_priority_without_privilege_names_the_argument():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base == -20:
        pytest.skip("already at the highest priority")
    with pytest.raises(PermissionError, match="worker_nice"):
        PipelinedVectorEnv([_busy], worker_nice=base - 1)
