"""Errors: worker exceptions, crashes, timeouts, bad input and misuse."""

from __future__ import annotations

import functools
import multiprocessing
import signal
from functools import partial

import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError

from pipelined_vec_env import (
    RemoteTraceback,
    StageFailedError,
    WaitTimeoutError,
    WorkerCrashedError,
    WorkerError,
)
from pipelined_vec_env.debug_envs import CountingEnv, FaultyEnv
from pipelined_vec_env.testing import kill_worker

pytestmark = pytest.mark.timeout(60)

F = FaultyEnv


@pytest.fixture
def make_pipelined(make_pipelined):
    """These tests address workers by env (worker k owns env k): one env per worker unless
    a test asks for another layout (the default layout is tested in test_equivalence.py)."""
    return functools.partial(make_pipelined, envs_per_worker=1)


def faulty(make_pipelined, n=4, stages=2, sleep=1.0):
    envs = make_pipelined([partial(FaultyEnv, sleep) for _ in range(n)], num_stages=stages)
    envs.reset(seed=0)
    return envs


def acts(*values):
    return np.array(values, dtype=np.int64)


def test_worker_exception_keeps_type_and_traceback(make_pipelined):
    envs = faulty(make_pipelined)
    envs.step_async(acts(F.NORMAL, F.RAISE), stage=0)
    with pytest.raises(ValueError, match="told to raise") as info:
        envs.step_wait(stage=0)
    assert type(info.value) is ValueError  # not double-wrapped
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "FaultyEnv" in str(info.value.__cause__) and "step" in info.value.__cause__.tb
    # the failed stage refuses to step until reset; the other stage is untouched
    with pytest.raises(StageFailedError, match="reset"):
        envs.step_async(acts(0, 0), stage=0)
    envs.step_async(acts(0, 0), stage=1)
    obs, *_ = envs.step_wait(stage=1)
    np.testing.assert_array_equal(obs[:, 0], [1, 1])
    envs.reset_async(stage=0)
    envs.reset_wait(stage=0)
    envs.step_async(acts(0, 0), stage=0)
    obs, *_ = envs.step_wait(stage=0)
    np.testing.assert_array_equal(obs[:, 0], [1, 1])


@pytest.mark.parametrize(
    "action,type_name",
    [(F.ODD_ERROR, "OddConstructorError"), (F.UNPICKLABLE_ERROR, "UnpicklableError")],
)
def test_exception_that_cannot_be_rebuilt_becomes_worker_error(make_pipelined, action, type_name):
    envs = faulty(make_pipelined)
    with pytest.raises(WorkerError) as info:
        envs.step(acts(0, 0, action, 0))
    assert type_name in info.value.type_name
    assert "Traceback" in info.value.traceback and info.value.worker_index == 2


@pytest.mark.parametrize("action,exitcode", [(F.EXIT, 3), (F.SIGKILL, -signal.SIGKILL)])
def test_dead_worker_raises_crashed_error_and_other_stages_go_on(make_pipelined, action, exitcode):
    envs = faulty(make_pipelined)
    envs.step_async(acts(0, 0), stage=0)
    envs.step_async(acts(0, action), stage=1)
    with pytest.raises(WorkerCrashedError) as info:
        envs.step_wait(stage=1)
    err = info.value
    assert (err.worker_index, err.env_indices, err.exitcode) == (3, (3,), exitcode)
    obs, *_ = envs.step_wait(stage=0)
    np.testing.assert_array_equal(obs[:, 0], [1, 1])
    with pytest.raises(StageFailedError):
        envs.step_async(acts(0, 0), stage=1)
    with pytest.raises(WorkerCrashedError, match="includes all its envs"):
        envs.reset(seed=0, options={"reset_mask": np.array([True, True, True, False])})
    envs.step_async(acts(0, 0), stage=0)  # the refused reset touched nothing
    obs, *_ = envs.step_wait(stage=0)
    np.testing.assert_array_equal(obs[:, 0], [2, 2])
    old_pid = envs.stages[1].workers[1].process.pid
    envs.reset_async(seed=0, stage=1)
    obs, _ = envs.reset_wait(stage=1)
    np.testing.assert_array_equal(obs[:, 0], [0, 0])  # a reset rebuilt the dead worker
    assert envs.stages[1].workers[1].process.pid != old_pid
    assert envs.restart_counts == (0, 0, 0, 0)  # not a restart: max_restarts is untouched
    obs, *_ = envs.step(acts(0, 0, 0, 0))
    np.testing.assert_array_equal(obs[:, 0], [3, 3, 1, 1])
    envs.close()
    envs.close()  # idempotent


def test_sigkill_from_outside_is_noticed_on_next_wait(make_pipelined):
    envs = faulty(make_pipelined)
    kill_worker(envs, envs.stages[0].workers[1].index)
    envs.step_async(acts(0, 0), stage=0)
    with pytest.raises(WorkerCrashedError) as info:
        envs.step_wait(stage=0)
    assert info.value.env_indices == (1,) and info.value.exitcode == -signal.SIGKILL


def test_sigkill_while_waiting_without_timeout(make_pipelined):
    envs = faulty(make_pipelined, sleep=30.0)
    envs.step_async(acts(0, F.SLEEP), stage=0)
    with pytest.raises(WaitTimeoutError):
        envs.step_wait(stage=0, timeout=0.2)
    kill_worker(envs, envs.stages[0].workers[1].index)
    with pytest.raises(WorkerCrashedError):
        envs.step_wait(stage=0)  # timeout=None: would hang forever without the sentinel


def test_timeout_then_real_result_never_stale(make_pipelined):
    envs = faulty(make_pipelined, sleep=1.0)
    envs.step_async(acts(F.SLEEP, 0), stage=0)
    with pytest.raises(WaitTimeoutError) as info:
        envs.step_wait(stage=0, timeout=0.05)
    assert isinstance(info.value, multiprocessing.TimeoutError)
    assert isinstance(info.value, TimeoutError)
    with pytest.raises(AlreadyPendingCallError):
        envs.step_async(acts(0, 0), stage=0)  # still in flight
    obs, *_ = envs.step_wait(stage=0)
    np.testing.assert_array_equal(obs[:, 0], [1, 1])
    envs.step_async(acts(0, 0), stage=0)
    obs, *_ = envs.step_wait(stage=0, timeout=30)
    np.testing.assert_array_equal(obs[:, 0], [2, 2])


def test_misuse_raises_gymnasium_errors(make_pipelined):
    envs = faulty(make_pipelined)
    with pytest.raises(NoAsyncCallError):
        envs.step_wait(stage=0)
    envs.step_async(acts(0, 0), stage=0)
    with pytest.raises(AlreadyPendingCallError):
        envs.step_async(acts(0, 0), stage=0)
    with pytest.raises(AlreadyPendingCallError):
        envs.step_async(acts(0, 0, 0, 0))  # stage=None needs every stage idle
    with pytest.raises(AlreadyPendingCallError):
        envs.reset_async(stage=0)
    with pytest.raises(NoAsyncCallError):
        envs.reset_wait(stage=0)
    with pytest.raises(NoAsyncCallError):
        envs.step_wait()  # started per stage, awaited for all
    envs.reset_async(stage=1)  # a stage may reset while another steps
    envs.step_wait(stage=0)
    envs.reset_wait(stage=1)
    with pytest.raises(ValueError, match="stage"):
        envs.step_async(acts(0, 0), stage=2)


@pytest.mark.parametrize(
    "actions,match",
    [
        (np.zeros((2, 1), dtype=np.int64), r"expected shape \(2,\)"),
        (np.zeros(3, dtype=np.int64), r"expected shape \(2,\)"),
        (np.zeros(2, dtype=np.float32), "integer dtype"),
        (np.array([0, 7]), r"actions\[1\]=7 is outside"),
        (np.array([-1, 0]), "outside"),
    ],
)
def test_bad_actions_rejected_before_any_worker_moves(make_pipelined, actions, match):
    envs = make_pipelined([partial(CountingEnv, i, 100) for i in range(4)], num_stages=2)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        envs.step_async(actions, stage=0)
    envs.step_async(np.zeros(2, dtype=np.int64), stage=0)  # the stage is still idle
    obs, *_ = envs.step_wait(stage=0)
    np.testing.assert_array_equal(obs[:, 1], [1, 1])  # the bad call moved no env


def test_bad_box_actions(make_pipelined):
    from pipelined_vec_env.debug_envs import BusyEnv

    envs = make_pipelined([partial(BusyEnv, 0.0, 4, 3) for _ in range(2)])
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"expected shape \(2, 3\)"):
        envs.step(np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="numeric dtype"):
        envs.step(np.array([["a"] * 3] * 2))
    obs, *_ = envs.step(np.zeros((2, 3), dtype=np.float64))  # reaches the env as float64
    assert obs.dtype == np.float32


def test_bad_arguments_rejected_before_workers_start():
    from pipelined_vec_env import PipelinedVectorEnv

    fns = [partial(CountingEnv, i) for i in range(3)]
    with pytest.raises(ValueError, match="num_stages"):
        PipelinedVectorEnv(fns, num_stages=4)
    with pytest.raises(ValueError, match="envs_per_worker"):
        PipelinedVectorEnv(fns, envs_per_worker=0)
    with pytest.raises(ValueError, match="cpu_affinity"):
        PipelinedVectorEnv(fns, cpu_affinity=[[0]])
    with pytest.raises(ValueError, match="env_fns"):
        PipelinedVectorEnv([])
    with pytest.raises(ValueError, match="observation_mode"):
        PipelinedVectorEnv(fns, observation_mode="other")


def test_env_constructor_error_is_reraised_and_workers_are_cleaned_up():
    from pipelined_vec_env import PipelinedVectorEnv

    def broken():
        raise KeyError("no such simulator")

    before = set(multiprocessing.active_children())
    with pytest.raises(KeyError, match="no such simulator"):
        PipelinedVectorEnv([partial(CountingEnv, 0), broken])
    assert set(multiprocessing.active_children()) <= before


def test_bad_seed_and_reset_mask(make_pipelined):
    envs = make_pipelined([partial(CountingEnv, i) for i in range(4)], num_stages=2)
    with pytest.raises(ValueError, match="one entry per env"):
        envs.reset_async(seed=[1, 2, 3], stage=0)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        envs.reset_async(options={"reset_mask": np.ones(4, dtype=bool)}, stage=0)
    with pytest.raises(TypeError, match="dtype bool"):
        envs.reset_async(options={"reset_mask": np.ones(2, dtype=int)}, stage=0)
    with pytest.raises(ValueError, match="at least one True"):
        envs.reset_async(options={"reset_mask": np.zeros(2, dtype=bool)}, stage=0)
    envs.reset(seed=[1, 2, 3, 4])
