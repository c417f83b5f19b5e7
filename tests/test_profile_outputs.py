"""The profiler's outputs read a `Recording`, not the profiler: a recording written by hand
gives the summary numbers and trace placement worked out on paper, and `Profiler.snapshot`
hands the outputs a copy."""

from __future__ import annotations

import gymnasium as gym
import pytest

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.profiling.chrome_trace import build_trace, write_trace
from pipelined_vec_env.profiling.profiler import Profiler, ProfilingDisabledError
from pipelined_vec_env.profiling.records import Recording, merged_waits, placed
from pipelined_vec_env.profiling.summary import summarize

MS = 1_000_000


def _recording(**changes) -> Recording:
    """One stage, two workers stepping one round from 0 to 10 ms.

    Worker 0 works 1-9 ms, worker 1 works 1-3 ms and its answer waits in the pipe; the
    caller runs inference 0-5 ms and waits 5-10 ms.
    """
    fields = {
        "commands": (
            (0, "step", 0, 1 * MS, 9 * MS, 10 * MS, "ok"),
            (1, "step", 0, 1 * MS, 3 * MS, 10 * MS, "ok"),
        ),
        "stage_spans": ((0, "step", 0, 10 * MS),),
        "rounds": ((0, 0, 9 * MS, [8 * MS, 2 * MS]),),
        "waits": (("wait", 0, 5 * MS, 10 * MS),),
        "spans": (("inference", None, 0, 0, 5 * MS),),
        "instants": (),
        "windows": ((0, None),),
        "workers": {0: (0, (0,)), 1: (0, (1,))},
        "threads": {0: "MainThread"},
        "num_stages": 1,
        "taken_at": 100 * MS,
    }
    return Recording(**{**fields, **changes})


def test_summary_of_a_recording_written_by_hand():
    s = summarize(_recording())
    assert s["wall_s"] == pytest.approx(0.010)
    assert s["workers"]["0"]["busy_fraction"] == pytest.approx(0.8)
    assert s["workers"]["1"]["busy_fraction"] == pytest.approx(0.2)
    assert s["stages"]["0"]["env_busy_fraction"] == pytest.approx(0.5)
    assert s["caller_busy_fraction"] == pytest.approx(0.5)
    assert s["policy_idle_fraction"] == pytest.approx(0.5)
    # way there 1 ms each; way back while the caller waited: 1 ms (worker 0), 5 ms (worker 1)
    assert s["workers"]["0"]["transport_overhead_s"] == pytest.approx(0.002)
    assert s["workers"]["1"]["transport_overhead_s"] == pytest.approx(0.006)
    assert s["transport_fraction"] == pytest.approx(8 / 18)
    assert s["stages"]["0"]["straggler_fraction"] == pytest.approx(1 - 5 / 8)
    assert s["bottleneck"] == "straggler" and "worker 0" in s["bottleneck_reason"]
    # e = 9 ms, p = 5 ms per round: 1 stage 14 ms, 2 stages 11.5 ms, decoupled 9 ms
    speedup = s["predicted_speedup"]
    assert speedup["stages"] == pytest.approx({"1": 1.0, "2": 14 / 11.5})
    assert speedup["decoupled"] == pytest.approx(14 / 9)


def test_paused_time_is_left_out_of_the_wall_time():
    recording = _recording(windows=((0, 4 * MS), (6 * MS, None)))
    assert recording.wall_ns() == 8 * MS
    assert summarize(recording)["wall_s"] == pytest.approx(0.008)


def test_trace_centres_a_worker_span_on_another_clock(tmp_path):
    other = (0, "step", 0, 1000 * MS, 1004 * MS, 10 * MS, "ok")  # 4 ms on a foreign clock
    recording = _recording(commands=(other,))
    assert placed(0, 1000 * MS, 1004 * MS, 10 * MS) == (3 * MS, 4 * MS)
    trace = build_trace(recording)
    (event,) = [e for e in trace["traceEvents"] if e.get("cat") == "command"]
    assert (event["ts"], event["dur"]) == (3000.0, 4000.0)
    assert event["args"]["clock"] == "shifted"
    assert event["args"]["sent_to_start_us"] == event["args"]["end_to_received_us"] == 3000.0
    assert write_trace(recording, tmp_path / "t.json").read_text().startswith('{"traceEvents"')


def test_overlapping_waits_merge_into_one():
    waits = [("wait", 1, 5, 9), ("wait", 0, 0, 6), ("recv", None, 12, 13)]
    assert merged_waits(waits) == [("wait", (0, 1), 0, 9), ("recv", (), 12, 13)]


def test_snapshot_is_a_copy_the_outputs_read():
    envs = PipelinedVectorEnv([lambda: gym.make("CartPole-v1")] * 2, profile=True)
    try:
        envs.reset(seed=0)
        snapshot = envs.profiler.snapshot()
        assert [r[1] for r in snapshot.commands] == ["reset", "reset"]
        assert snapshot.num_envs == 2 and set(snapshot.workers) == {0, 1}
        envs.step(envs.action_space.sample())
        assert len(snapshot.commands) == 2  # later records do not reach it
        assert summarize(envs.profiler.snapshot()) == envs.profiler.summary()
    finally:
        envs.close()
    with pytest.raises(ProfilingDisabledError, match="snapshot"):
        Profiler(enabled=False).snapshot()
