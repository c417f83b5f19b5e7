"""The pipeline profiler through the public API: trace structure, summary, bottleneck
classes on workloads whose answer is clear, the timeline PNG, off mode and wrappers."""

from __future__ import annotations

import functools
import json
import time
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import pipelined_vec_env
from pipelined_vec_env.debug_envs import CountingEnv, EchoEnv, FaultyEnv
from pipelined_vec_env.profiling.profiler import BOTTLENECKS, ProfilingDisabledError
from pipelined_vec_env.workers.protocol import Command

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def make_pipelined(make_pipelined):
    """These tests address workers by env (worker k owns env k): one env per worker unless
    a test asks for another layout (the default layout is tested in test_equivalence.py)."""
    return functools.partial(make_pipelined, envs_per_worker=1)


class BigInfoEnv(gym.Env):
    """Steps in microseconds but answers with a large info payload: transport-bound."""

    def __init__(self, megabytes: int = 16) -> None:
        self.observation_space = spaces.Box(0, 1, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.blob = b"x" * (megabytes << 20)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        return np.zeros(1, dtype=np.float32), 0.0, False, False, {"blob": self.blob}


def _sleepy(seconds: float) -> FaultyEnv:
    return FaultyEnv(seconds)


def _staged_loop(envs, rounds: int, infer_seconds: float = 0.0) -> None:
    envs.reset(seed=0)
    for _ in range(rounds):
        for s in range(envs.num_stages):
            with envs.profiler.span("inference", stage=s):
                if infer_seconds:
                    time.sleep(infer_seconds)
                n = envs.stage_slices[s].stop - envs.stage_slices[s].start
                actions = np.zeros(n, dtype=np.int64)
            envs.step_async(actions, stage=s)
        for s in range(envs.num_stages):
            envs.step_wait(stage=s)


def test_trace_has_a_track_per_worker_stage_and_caller(make_pipelined, tmp_path):
    envs = make_pipelined([CountingEnv] * 4, num_stages=2, profile=True)
    _staged_loop(envs, rounds=10)
    path = envs.profiler.export_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in complete)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert set(processes.values()) == {"caller", "stages", "workers"}
    by_name = {v: k for k, v in processes.items()}
    for w in range(4):
        track = (by_name["workers"], w)
        assert names[track].startswith(f"worker {w} (stage {w // 2}")
        steps = [e for e in complete if (e["pid"], e["tid"]) == track and e["name"] == "step"]
        assert len(steps) == 10
        # one clock for caller and workers: each worker span lies inside its round trip
        assert all("clock" not in e["args"] for e in steps)
        assert all(e["args"]["sent_to_start_us"] >= 0 for e in steps)
        assert all(e["args"]["end_to_received_us"] >= 0 for e in steps)
        assert all(e["dur"] <= e["args"]["round_trip_us"] for e in steps)
    for s in range(2):
        track = (by_name["stages"], s)
        assert names[track] == f"stage {s}"
        assert sum(e["name"] == "step" for e in complete if (e["pid"], e["tid"]) == track) == 10
    caller = [e for e in complete if e["pid"] == by_name["caller"]]
    assert sum(e["name"] == "inference" for e in caller) == 20
    assert {e["args"]["stage"] for e in caller if e["name"] == "inference"} == {0, 1}
    assert any(e["cat"] == "wait" for e in caller)


def test_summary_keys_and_ranges(make_pipelined):
    envs = make_pipelined([CountingEnv] * 4, num_stages=2, profile=True)
    _staged_loop(envs, rounds=20, infer_seconds=0.002)
    summary = envs.profiler.summary()
    json.dumps(summary)  # JSON-ready
    assert summary["wall_s"] > 0.08  # 40 inference spans of 2 ms
    assert set(summary["stages"]) == {"0", "1"}
    for stage in summary["stages"].values():
        assert 0.0 <= stage["env_busy_fraction"] <= 1.0
        assert 0.0 <= stage["policy_idle_fraction"] <= 1.0
        assert stage["caller_wait_s"] >= 0.0
        assert stage["inference_s"] >= 20 * 0.002
        assert stage["step_rounds"] == 20
    assert summary["inference_s"] == pytest.approx(
        sum(s["inference_s"] for s in summary["stages"].values())
    )
    assert summary["policy_idle_fraction"] == pytest.approx(
        1 - summary["inference_s"] / summary["wall_s"]
    )
    assert set(summary["workers"]) == {"0", "1", "2", "3"}
    for worker in summary["workers"].values():
        assert 0 < worker["step_p50_s"] <= worker["step_p99_s"]
        assert worker["transport_overhead_s"] >= 0
    assert summary["bottleneck"] in BOTTLENECKS
    assert summary["bottleneck_reason"].startswith(summary["bottleneck"] + ":")
    predicted = summary["predicted_speedup"]
    assert set(predicted["stages"]) == {"1", "2", "4"}
    assert predicted["stages"]["2"] == pytest.approx(1.0)  # the recorded layout
    assert predicted["stages"]["1"] <= 1.0 <= predicted["decoupled"]


def test_slow_env_is_the_bottleneck(make_pipelined):
    envs = make_pipelined([partial(_sleepy, 0.03)] * 2, profile=True)
    envs.reset(seed=0)
    for _ in range(10):
        with envs.profiler.span("inference"):
            actions = np.full(2, FaultyEnv.SLEEP)
        envs.step(actions)
    summary = envs.profiler.summary()
    assert summary["bottleneck"] == "env", summary["bottleneck_reason"]
    assert summary["caller_busy_fraction"] < 0.5
    assert summary["workers"]["0"]["step_p50_s"] >= 0.03
    # overlapping a policy that takes ~nothing cannot help much
    assert summary["predicted_speedup"]["stages"]["2"] < 1.2


def test_sleeping_policy_is_the_bottleneck(make_pipelined):
    envs = make_pipelined([CountingEnv] * 2, profile=True)
    envs.reset(seed=0)
    for _ in range(10):
        with envs.profiler.span("inference"):
            time.sleep(0.03)
            actions = np.zeros(2, dtype=np.int64)
        envs.step(actions)
    summary = envs.profiler.summary()
    assert summary["bottleneck"] == "policy", summary["bottleneck_reason"]
    assert summary["policy_idle_fraction"] < 0.5
    assert summary["stages"]["0"]["inference_s"] >= 0.3


def test_one_slow_worker_is_a_straggler(make_pipelined):
    fns = [partial(_sleepy, 0.08)] + [partial(_sleepy, 0.005)] * 3
    envs = make_pipelined(fns, profile=True)
    envs.reset(seed=0)
    for _ in range(6):
        envs.step(np.full(4, FaultyEnv.SLEEP))
    summary = envs.profiler.summary()
    assert summary["bottleneck"] == "straggler", summary["bottleneck_reason"]
    assert summary["stages"]["0"]["straggler_fraction"] > 0.5
    assert "worker 0" in summary["bottleneck_reason"]


def test_large_answers_make_transport_the_bottleneck(make_pipelined):
    envs = make_pipelined([BigInfoEnv] * 2, profile=True)
    envs.reset(seed=0)
    for _ in range(8):
        envs.step(np.zeros(2, dtype=np.int64))
    summary = envs.profiler.summary()
    assert summary["bottleneck"] == "transport", summary["bottleneck_reason"]
    assert summary["transport_fraction"] > 0.8
    worker = summary["workers"]["0"]
    assert worker["transport_overhead_s"] > 10 * worker["step_p50_s"]


def test_plot_writes_a_png(make_pipelined, tmp_path):
    envs = make_pipelined([CountingEnv] * 4, num_stages=2, profile=True)
    _staged_loop(envs, rounds=5)
    path = envs.profiler.plot(tmp_path / "timeline.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(str(path))
    assert image.shape[0] > 100 and image.shape[1] > 500


def test_off_mode_records_nothing_and_exports_raise(make_pipelined, tmp_path):
    envs = make_pipelined([CountingEnv] * 2)
    assert not envs.profiler.enabled
    envs.reset(seed=0)
    with envs.profiler.span("inference"):
        envs.step(np.zeros(2, dtype=np.int64))
    for export in (
        lambda: envs.profiler.export_chrome_trace(tmp_path / "t.json"),
        lambda: envs.profiler.plot(tmp_path / "t.png"),
        envs.profiler.summary,
    ):
        with pytest.raises(ProfilingDisabledError, match="profile=True"):
            export()
    assert not (tmp_path / "t.json").exists()


def test_profiler_through_wrappers_and_make_vec():
    envs = pipelined_vec_env.make_vec("CartPole-v1", 2, num_stages=2, profile=True)
    try:
        wrapped = gym.wrappers.vector.RecordEpisodeStatistics(envs)
        assert wrapped.unwrapped.profiler is envs.profiler
        assert envs.profiler.enabled
        wrapped.reset(seed=0)
        wrapped.step(np.zeros(2, dtype=np.int64))
        assert envs.profiler.summary()["workers"]["1"]["step_p50_s"] > 0
    finally:
        envs.close()
    plain = pipelined_vec_env.make_vec("CartPole-v1", 1)
    try:
        assert not plain.profiler.enabled
    finally:
        plain.close()


def test_decoupled_mode_records_commands_and_recv_waits(make_pipelined):
    envs = make_pipelined([CountingEnv] * 4, envs_per_worker=2, profile=True)
    envs.async_reset(seed=0)
    for _ in range(10):
        _, _, _, _, infos = envs.recv(batch_size=2)
        envs.send(np.zeros(len(infos["env_id"]), dtype=np.int64), infos["env_id"])
    envs.recv(batch_size=4)
    summary = envs.profiler.summary()
    commands = sum(w["commands"] for w in summary["workers"].values())
    assert commands >= 12  # 2 resets and one step per env batch sent
    assert summary["caller_wait_s"] > 0
    trace = envs.profiler.chrome_trace()
    assert any(e["ph"] == "X" and e["name"].startswith("recv") for e in trace["traceEvents"])


def test_profiled_send_recv_of_whole_workers_takes_the_slots_lane(make_pipelined, lane_joins):
    # a profile of send/recv shows the loop that runs unprofiled: whole workers' steps go
    # through the slots' lane, each with the worker's own start and finish times
    envs = make_pipelined(
        [partial(EchoEnv, i, 0.0) for i in range(4)], envs_per_worker=2, profile=True
    )
    envs.async_reset(seed=0)
    for t in range(20):
        observations, *_, infos = envs.recv(batch_size=2)
        ids = infos["env_id"]
        assert (observations[:, 0] == ids).all()  # each row is its env's
        envs.send(np.full(len(ids), t, dtype=np.int64), ids)
    envs.recv(batch_size=4)
    assert lane_joins.joined >= 15  # the first recv takes the resets the general way
    records = envs.profiler.records()
    steps = [r for r in records["commands"] if r[1] == Command.STEP]
    assert len(steps) >= 20  # one per worker sent
    for _, _, sent, started, finished, received, kind in steps:
        assert kind == "ok"
        assert started is not None and finished is not None
        assert sent <= received and started <= finished
    waits = [w for w in records["waits"] if w[0] == "recv"]
    assert len(waits) == 21 and all(t0 <= t1 for _, _, t0, t1 in waits)


def test_restarts_and_deadline_kills_are_instant_events(make_pipelined):
    envs = make_pipelined(
        [partial(_sleepy, 60.0)] * 2, step_deadline=0.5, max_restarts=1, profile=True
    )
    envs.reset(seed=0)
    envs.step(np.array([FaultyEnv.SLEEP, FaultyEnv.NORMAL]))  # worker 0 is killed, rebuilt
    envs.step(np.zeros(2, dtype=np.int64))
    instants = [e for e in envs.profiler.chrome_trace()["traceEvents"] if e["ph"] == "i"]
    kinds = {(e["name"], e["tid"]) for e in instants}
    assert {("deadline kill", 0), ("restart", 0)} <= kinds
    assert not any(tid == 1 for _, tid in kinds)
    starts = [r for r in envs.profiler.records()["commands"] if r[1] == "start"]
    assert [r[0] for r in starts] == [0]  # the rebuilt worker's start-up


def test_pause_leaves_time_out_of_wall(make_pipelined):
    envs = make_pipelined([CountingEnv] * 2, profile=True)
    envs.reset(seed=0)
    envs.profiler.pause()
    time.sleep(0.3)
    envs.step(np.zeros(2, dtype=np.int64))  # not recorded
    envs.profiler.resume()
    envs.step(np.zeros(2, dtype=np.int64))
    summary = envs.profiler.summary()
    assert summary["wall_s"] < 0.3
    assert summary["workers"]["0"]["commands"] == 2  # the reset and the second step


@pytest.mark.parametrize("slow", ["policy", "env"])
def test_inference_channel_bottleneck(make_pipelined, slow):
    from pipelined_vec_env.stepping.channel import InferenceChannel

    envs = make_pipelined([partial(_sleepy, 0.03)] * 2, profile=True)

    def policy(obs, env_ids):
        with envs.profiler.span("inference"):  # on the actor's thread
            if slow == "policy":
                time.sleep(0.03)
            action = FaultyEnv.SLEEP if slow == "env" else FaultyEnv.NORMAL
            return np.full(len(env_ids), action, dtype=np.int64)

    with InferenceChannel(envs, [policy]) as channel:
        channel.reset(seed=0)
        channel.run(steps_per_env=8)
    summary = envs.profiler.summary()
    assert summary["bottleneck"] == slow, summary["bottleneck_reason"]
    trace = envs.profiler.chrome_trace()["traceEvents"]
    tracks = {e["args"]["name"] for e in trace if e["name"] == "thread_name" and e["pid"] == 1}
    assert any("actor" in name for name in tracks)  # the actor thread's own track
    waits = [e for e in trace if e["ph"] == "X" and e["cat"] == "wait"]
    assert {e["tid"] for e in waits} == {0}  # on the driving thread's track
    spans = [e for e in trace if e["ph"] == "X" and e["name"] == "inference"]
    assert 0 not in {e["tid"] for e in spans}
    assert any(e["ph"] == "X" and e["name"].startswith("channel wait") for e in trace)


def test_the_profiler_pairs_an_env_step_answer_with_its_own_send():
    from pipelined_vec_env.profiling.profiler import Profiler

    profiler = Profiler(enabled=True)
    profiler.add_worker(0, 0, (0, 1))
    profiler.command_sent(0, Command.STEP_ENV, 0)
    time.sleep(0.001)  # the two sends at distinct times
    profiler.command_sent(0, Command.STEP_ENV, 1)
    profiler.command_sent(0, Command.CALL)
    profiler.answer_received(0, "ok", (5, 6), 1)  # env 1 first: out of order
    profiler.answer_received(0, "ok", (7, 8), 0)
    profiler.answer_received(0, "ok", None)
    records = profiler.records()["commands"]
    assert [r[1] for r in records] == [Command.STEP_ENV, Command.STEP_ENV, Command.CALL]
    first, second, _ = records
    assert first[2] > second[2]  # env 1's answer has env 1's (later) send time
