"""The gymnasium VectorEnv contract beyond step/reset, and the stage helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from functools import partial

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector import AutoresetMode

from pipelined_vec_env import WaitTimeoutError
from pipelined_vec_env.debug_envs import CountingEnv, FaultyEnv

pytestmark = pytest.mark.timeout(120)


class ThreadReportingEnv(CountingEnv):
    """Reports what the worker process looks like from inside."""

    def worker_report(self) -> dict:
        return {
            "pid": os.getpid(),
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "affinity": sorted(os.sched_getaffinity(0)),
        }


def counting(n, **kw):
    return [partial(CountingEnv, i, 3, **kw) for i in range(n)]


def test_layout_follows_array_split(make_pipelined):
    envs = make_pipelined(counting(7), num_stages=3, envs_per_worker=2)
    assert envs.stage_slices == (slice(0, 3), slice(3, 5), slice(5, 7))
    workers = [w.env_indices for s in envs.stages for w in s.workers]
    assert workers == [(0, 1), (2,), (3, 4), (5, 6)]
    assert len({w.process.pid for s in envs.stages for w in s.workers}) == 4


def test_spaces_metadata_and_attributes(make_pipelined):
    envs = make_pipelined(counting(4, render_mode="rgb_array"), num_stages=2)
    ref = gym.vector.SyncVectorEnv(counting(4, render_mode="rgb_array"))
    assert envs.single_observation_space == ref.single_observation_space
    assert envs.observation_space == ref.observation_space
    assert envs.single_action_space == ref.single_action_space
    assert envs.action_space == ref.action_space
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert envs.render_mode == "rgb_array"
    assert isinstance(envs, gym.vector.VectorEnv)
    envs.reset(seed=0)
    envs.step(np.zeros(4, dtype=np.int64))
    frames = envs.render()
    assert isinstance(frames, tuple) and len(frames) == 4
    assert frames[0].shape == (4, 4, 3) and frames[0][0, 0, 0] == 1
    assert envs.get_attr("env_id") == (0, 1, 2, 3)
    envs.set_attr("episode_length", 9)
    assert envs.get_attr("episode_length") == (9,) * 4
    envs.set_attr("episode_length", [1, 2, 3, 4])
    assert envs.call("__getattribute__", "episode_length") == (1, 2, 3, 4)
    assert envs.call_at([3, 0], "__getattribute__", "env_id") == (3, 0)
    envs.set_attr_at([1], "episode_length", [42])
    assert envs.get_attr("episode_length") == (1, 42, 3, 4)
    with pytest.raises(ValueError, match="one value per env"):
        envs.set_attr("episode_length", [1, 2])
    with pytest.raises(AttributeError):
        envs.get_attr("no_such_attribute")
    assert envs.get_attr("env_id") == (0, 1, 2, 3)  # still usable after an attribute error
    ref.close()


def test_torch_actions(make_pipelined):
    torch = pytest.importorskip("torch")
    envs = make_pipelined(counting(4), num_stages=2)
    envs.reset(seed=0)
    obs, rew, *_ = envs.step(torch.tensor([0, 1, 2, 0]))
    np.testing.assert_allclose(rew, [1, 2.01, 3.02, 1.03])
    envs.step_async(torch.ones(2, dtype=torch.int64), stage=1)
    _, rew, *_ = envs.step_wait(stage=1)
    np.testing.assert_allclose(rew, [3.02, 3.03])
    if torch.cuda.is_available():
        envs.step_async(torch.zeros(2, dtype=torch.int64, device="cuda"), stage=0)
        envs.step_wait(stage=0)


def test_wait_any_returns_the_stage_that_finished(make_pipelined):
    envs = make_pipelined([partial(FaultyEnv, 2.0) for _ in range(4)], num_stages=2)
    envs.reset(seed=0)
    envs.step_async(np.array([FaultyEnv.SLEEP, 0]), stage=0)
    envs.step_async(np.array([0, 0]), stage=1)
    assert envs.wait_any(timeout=30) == 1
    envs.step_wait(stage=1)
    with pytest.raises(TimeoutError):
        envs.wait_any(timeout=0.01)
    assert envs.wait_any() == 0
    envs.step_wait(stage=0)


def test_per_env_reset_options_split_per_stage(make_pipelined):
    envs = make_pipelined(counting(4), num_stages=2)
    obs, info = envs.reset(seed=0, options=[{"start_count": k} for k in (5, 6, 7, 8)])
    np.testing.assert_array_equal(obs[:, 1], [5, 6, 7, 8])
    envs.reset_async(options=[{"start_count": 1}, None], stage=1)
    obs, info = envs.reset_wait(stage=1)
    np.testing.assert_array_equal(obs[:, 1], [1, 0])
    with pytest.raises(ValueError, match="one dict"):
        envs.reset_async(options=[{"start_count": 1}], stage=1)


def test_seed_is_global_index_whatever_the_stage(make_pipelined):
    envs = make_pipelined(counting(4), num_stages=2)
    ref = gym.vector.SyncVectorEnv(counting(4))
    want, _ = ref.reset(seed=100)
    envs.reset_async(seed=100, stage=1)
    got, _ = envs.reset_wait(stage=1)
    np.testing.assert_array_equal(got, want[2:])
    ref.close()


def test_copy_false_returns_views_overwritten_by_next_step(make_pipelined):
    envs = make_pipelined(counting(2), copy=False)
    obs, _ = envs.reset(seed=0)
    first = obs[:, 1].copy()
    envs.step(np.zeros(2, dtype=np.int64))
    assert not np.array_equal(obs[:, 1], first)  # the view changed under us


def test_worker_threads_and_cpu_affinity_applied_inside_workers(make_pipelined):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("Linux only")
    cores = sorted(os.sched_getaffinity(0))
    fns = [partial(ThreadReportingEnv, i) for i in range(2)]
    envs = make_pipelined(fns, cpu_affinity="auto")
    reports = envs.call("worker_report")
    assert [r["omp"] for r in reports] == ["1", "1"]
    assert [r["affinity"] for r in reports] == [[cores[0]], [cores[1 % len(cores)]]]
    envs2 = make_pipelined(fns, cpu_affinity=[[cores[-1]], [cores[0]]], worker_threads=None)
    reports = envs2.call("worker_report")
    assert [r["affinity"] for r in reports] == [[cores[-1]], [cores[0]]]
    assert reports[0]["omp"] == os.environ.get("OMP_NUM_THREADS")


def test_close_is_idempotent_and_stops_workers(make_pipelined):
    envs = make_pipelined(counting(3), num_stages=3)
    procs = [w.process.pid for s in envs.stages for w in s.workers]
    envs.close()
    envs.close()
    assert envs.closed
    for pid in procs:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(ClosedEnvironmentError):
        envs.step(np.zeros(3, dtype=np.int64))


def test_call_async_and_call_wait_with_a_timeout(make_pipelined):
    envs = make_pipelined([partial(FaultyEnv, 1.0) for _ in range(2)], num_stages=2)
    envs.reset(seed=0)
    with pytest.raises(NoAsyncCallError):
        envs.call_wait()
    envs.call_async("step", FaultyEnv.SLEEP)  # env.step itself, called in each worker
    with pytest.raises(AlreadyPendingCallError):
        envs.step_async(np.zeros(2, dtype=np.int64))
    with pytest.raises(WaitTimeoutError):
        envs.call_wait(timeout=0.05)  # the call stays in flight
    results = envs.call_wait(timeout=30)
    assert [float(r[0][0]) for r in results] == [1.0, 1.0]  # each env's step count after it
    assert envs.call_async("__getattribute__", "count") is None and envs.call_wait() == (1, 1)
    obs, *_ = envs.step(np.zeros(2, dtype=np.int64))  # the stages are idle again
    assert obs[:, 0].tolist() == [2, 2]


def test_close_with_a_call_in_flight_returns(make_pipelined):
    envs = make_pipelined([partial(FaultyEnv, 60.0) for _ in range(2)], num_stages=2)
    envs.reset(seed=0)
    envs.step_async(np.array([FaultyEnv.SLEEP]), stage=0)
    start = time.monotonic()
    envs.close(timeout=0.5)
    assert envs.closed and time.monotonic() - start < 30  # generous: catches a hang only


def test_workers_die_with_their_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from functools import partial
            from pipelined_vec_env import PipelinedVectorEnv
            from pipelined_vec_env.debug_envs import CountingEnv
            if __name__ == "__main__":
                envs = PipelinedVectorEnv([partial(CountingEnv, i) for i in range(2)], num_stages=2)
                envs.reset(seed=0)
                print(" ".join(str(w.process.pid) for s in envs.stages for w in s.workers), flush=True)
                time.sleep(600)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
            psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            for p in pids
        ):
            time.sleep(0.1)
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        assert alive == []
    finally:
        proc.kill()
        proc.wait()


def test_gymnasium_vector_wrappers_work_on_whole_env_calls(make_pipelined):
    from gymnasium.wrappers.vector import NormalizeObservation, RecordEpisodeStatistics

    def wrap(envs):
        return RecordEpisodeStatistics(NormalizeObservation(envs))

    fns = [partial(CountingEnv, i, 2 + i) for i in range(4)]
    ours = wrap(make_pipelined(fns, num_stages=2, envs_per_worker=2))
    ref = wrap(gym.vector.SyncVectorEnv(fns))
    o1, _ = ours.reset(seed=0)
    o2, _ = ref.reset(seed=0)
    np.testing.assert_allclose(o1, o2)
    for t in range(10):
        a = np.full(4, t % 3)
        got, want = ours.step(a), ref.step(a)
        np.testing.assert_allclose(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        if "episode" in want[4]:
            np.testing.assert_array_equal(got[4]["episode"]["r"], want[4]["episode"]["r"])
    assert list(ours.return_queue) == list(ref.return_queue) and len(ref.return_queue) > 0
    assert ours.unwrapped.stage_slices == (slice(0, 2), slice(2, 4))  # stage calls: .unwrapped
    ref.close()
