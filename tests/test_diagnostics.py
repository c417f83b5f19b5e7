"""Failures a user can locate: where a hung worker was, which signal killed one, a close
whose env raises, an info that cannot be sent, and a render GPU per worker.

Each test is a user's scenario through the public API. Bounds are generous (a hang
shows as a pytest-timeout failure); the close test compares against its own timeout.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
import warnings

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest

from pipelined_vec_env import PipelinedVectorEnv, WaitTimeoutError, WorkerCrashedError
from pipelined_vec_env.debug_envs import CountingEnv

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(120)


def stuck_in_physics() -> None:
    """Loops forever, as a simulator stuck in its solver would."""
    while True:
        sum(range(1000))


class HangingEnv(CountingEnv):
    """Env 1 of the test hangs in `stuck_in_physics` on a step with action 1 (or at
    construction with ``hang_build``); action 2 SIGKILLs or SIGSEGVs its worker."""

    def __init__(self, env_id: int = 0, hang_build: bool = False, die_by: int = 9) -> None:
        super().__init__(env_id)
        self.die_by = die_by
        if hang_build:
            stuck_in_physics()

    def step(self, action):
        if action == 1:
            stuck_in_physics()
        if action == 2:
            os.kill(os.getpid(), self.die_by)
        return super().step(action)


def _envs(n: int, **kwargs):
    return [lambda i=i: HangingEnv(i, **kwargs) for i in range(n)]


def test_hang_names_the_function_it_hung_in(make_pipelined) -> None:
    env = make_pipelined(_envs(2), step_deadline=2)
    env.reset(seed=0)
    with pytest.raises(WorkerCrashedError) as info:
        env.step(np.array([0, 1]))
    err = info.value
    assert err.worker_index == 1 and err.exitcode == -signal.SIGKILL
    assert err.stacks is not None and "stuck_in_physics" in err.stacks
    last_lines = str(err).splitlines()[-6:]
    # file and line of the frame (a class sent by value reads "<dynamic-code>" as its file)
    assert any(re.search(r'File ".+", line \d+ in stuck_in_physics', x) for x in last_lines)
    assert "step_deadline" in str(err)


def test_start_timeout_names_where_the_build_hung(make_pipelined) -> None:
    fns = [lambda: HangingEnv(0), lambda: HangingEnv(1, hang_build=True)]
    with pytest.raises(WaitTimeoutError, match="start_timeout") as info:
        make_pipelined(fns, start_timeout=3)
    assert "stuck_in_physics" in str(info.value)


def test_live_worker_gives_its_stacks_without_dying(make_pipelined) -> None:
    env = make_pipelined(_envs(2))
    env.reset(seed=0)
    stacks = env.workers[0].dump_stacks()
    assert stacks is not None and "Current thread" in stacks
    env.step(np.array([0, 0]))  # still serving
    assert env.workers[0].pid is not None


def test_sigkill_is_named_with_its_usual_cause(make_pipelined) -> None:
    env = make_pipelined(_envs(2))
    env.reset(seed=0)
    with pytest.raises(WorkerCrashedError, match=r"SIGKILL, signal 9.*OOM killer") as info:
        env.step(np.array([0, 2]))
    assert info.value.exitcode == -9 and info.value.signal_name == "SIGKILL"


def test_sigsegv_reads_as_a_native_crash(make_pipelined) -> None:
    env = make_pipelined(_envs(2, die_by=signal.SIGSEGV))
    env.reset(seed=0)
    with pytest.raises(WorkerCrashedError, match=r"SIGSEGV, signal 11.*native code") as info:
        env.step(np.array([2, 0]))
    assert info.value.exitcode == -11


def test_restart_log_names_the_signal(make_pipelined, caplog) -> None:
    env = make_pipelined(_envs(2), max_restarts=1)
    env.reset(seed=0)
    with caplog.at_level(logging.WARNING, logger="pipelined_vec_env"):
        env.step(np.array([0, 2]))
    assert any("SIGKILL" in r.getMessage() and "restart" in r.getMessage() for r in caplog.records)


class CloseRaisesEnv(CountingEnv):
    def close(self):
        raise OSError("renderer context already destroyed")


def test_close_with_a_raising_env_is_quick_and_warns() -> None:
    fns = [lambda: CountingEnv(0), lambda: CloseRaisesEnv(1), lambda: CountingEnv(2)]
    env = PipelinedVectorEnv(fns)
    env.reset(seed=0)
    pids = [w.pid for w in env.workers]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.monotonic()
        env.close(timeout=30)
        took = time.monotonic() - started
    assert took < 15, took  # the workers exited on CLOSE, not at the timeout
    texts = [str(w.message) for w in caught]
    assert any("env 1" in t and "OSError" in t and "renderer context" in t for t in texts), texts
    assert any("Traceback" in t for t in texts)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


class LockInInfoEnv(CountingEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.env_id == 1:
            info = {**info, "physics": {"sim_handle": threading.Lock()}}
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("envs_per_worker", [1, 2])
def test_unpicklable_info_names_env_and_key(make_pipelined, envs_per_worker) -> None:
    fns = [lambda i=i: LockInInfoEnv(i) for i in range(4)]
    env = make_pipelined(fns, envs_per_worker=envs_per_worker)
    env.reset(seed=0)
    with pytest.raises(TypeError) as info:
        env.step(np.zeros(4, dtype=np.int64))
    text = str(info.value)
    assert "env 1" in text and "sim_handle" in text and "lock" in text
    assert "Traceback" in str(info.value.__cause__)


class DeviceEnv(CountingEnv):
    def __init__(self, env_id: int) -> None:
        super().__init__(env_id)
        self.seen = os.environ.get("MUJOCO_EGL_DEVICE_ID")


def test_render_devices_round_robin(make_pipelined) -> None:
    fns = [lambda i=i: DeviceEnv(i) for i in range(6)]
    env = make_pipelined(fns, envs_per_worker=2, render_devices=[3, 5])
    assert env.get_attr("seen") == ("3", "3", "5", "5", "3", "3")
    assert env.get_attr("seen") != (os.environ.get("MUJOCO_EGL_DEVICE_ID"),) * 6


def test_render_devices_take_a_numpy_array_of_ids(make_pipelined) -> None:
    fns = [lambda i=i: DeviceEnv(i) for i in range(2)]
    env = make_pipelined(fns, envs_per_worker=1, render_devices=np.array([4, 2]))
    assert env.get_attr("seen") == ("4", "2")


@pytest.mark.parametrize("bad", [[], "0", [-1], [1.5], [True], 3, np.array([[0, 1]])])
def test_render_devices_rejected_before_workers_start(bad) -> None:
    with pytest.raises(ValueError, match="render_devices"):
        PipelinedVectorEnv([lambda: gym.make("CartPole-v1")], render_devices=bad)
