"""When the fast path's waits spin (`pipelined_vec_env.workers.spinning`, docs/wire_format.md
"What spins when"): the per-side gate over spun waits, its probes, and the load gate's
reading of ``/proc/loadavg``. Nothing here measures time: the waits that decide are made
long on purpose (a 2 ms sleep) or recorded directly."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from pipelined_vec_env import spinning
from pipelined_vec_env.debug_envs import FaultyEnv
from pipelined_vec_env.workers.spinning import PROBE_FIRST, PROBE_MAX, SPIN_SECONDS, SpinGate
from tests.test_fast_path import spin_as_on_a_quiet_machine, workers

QUICK, SLOW = SPIN_SECONDS / 10, SPIN_SECONDS * 40


def closed_gate() -> SpinGate:
    gate = SpinGate()
    assert gate.allows()
    gate.record(SLOW)
    assert gate.mean >= SPIN_SECONDS
    return gate


def waits_until_probe(gate: SpinGate, limit: int = 10 * PROBE_MAX) -> int:
    for n in range(1, limit + 1):
        if gate.allows():
            return n
    raise AssertionError("the gate never probed")


def test_gate_stays_open_while_spun_waits_are_quick():
    gate = SpinGate()
    for _ in range(100):
        assert gate.allows()
        gate.record(QUICK)


def test_closed_gate_probes_after_a_few_waits_and_a_quick_probe_reopens_it():
    gate = closed_gate()
    assert waits_until_probe(gate) == PROBE_FIRST
    gate.record(QUICK)  # the probe came in under the budget
    assert gate.mean < SPIN_SECONDS
    assert all(gate.allows() for _ in range(10))


def test_probes_that_miss_back_off_up_to_the_cap():
    gate = closed_gate()
    intervals = []
    for _ in range(10):
        intervals.append(waits_until_probe(gate))
        gate.record(SLOW)
    assert intervals[:3] == [PROBE_FIRST, 2 * PROBE_FIRST, 4 * PROBE_FIRST]
    assert max(intervals) == PROBE_MAX and intervals[-1] == PROBE_MAX


def test_slow_spun_waits_close_the_gate():
    gate = SpinGate()
    gate.record(QUICK)
    for _ in range(3):
        gate.record(SLOW)
    assert not gate.allows()


@pytest.fixture
def loadavg(monkeypatch):
    """Feed `machine_quiet` readings of the runnable tasks, one per call,
    `LOAD_SAMPLE_SECONDS` apart, on a 2-core machine."""
    readings: list[float] = []
    clock = iter(range(10**6))
    monkeypatch.setattr(spinning, "_runnable_now", lambda: readings.pop(0))
    monkeypatch.setattr(spinning, "usable_cores", lambda: 2)
    monkeypatch.setattr(spinning, "_load_seen", (-1.0, 0.0, 0.0))
    monkeypatch.setattr(
        spinning.time, "monotonic", lambda: next(clock) * spinning.LOAD_SAMPLE_SECONDS
    )
    return readings


def quiet_over(readings: list, samples: list[float]) -> list[bool]:
    readings += samples
    return [spinning.machine_quiet(2) for _ in samples]


def test_one_busy_reading_does_not_stop_the_spins(loadavg):
    settled = int(3.0 / spinning.LOAD_SAMPLE_SECONDS)  # readings of an idle machine
    assert all(quiet_over(loadavg, [1] * settled + [4, 1, 1, 3, 1]))


def test_other_work_that_keeps_running_stops_the_spins_within_seconds(loadavg):
    seconds = 3.0
    busy = int(seconds / spinning.LOAD_SAMPLE_SECONDS)
    quiet = quiet_over(loadavg, [1] * 5 + [4] * busy)
    assert all(quiet[:5]) and not quiet[-1]


def test_a_busy_first_reading_is_outweighed_at_once(loadavg):
    """The first reading often comes while the vector env's own workers are starting."""
    quiet = quiet_over(loadavg, [5] + [1] * 5)
    assert not quiet[0] and all(quiet[3:])


def test_the_spins_come_back_within_seconds_after_other_work_ends(loadavg):
    seconds = 5.0
    samples = int(seconds / spinning.LOAD_SAMPLE_SECONDS)
    quiet = quiet_over(loadavg, [4] * samples + [1] * samples)
    assert not quiet[samples - 1] and quiet[-1]


def test_spinning_comes_back_after_slow_steps(make_pipelined):
    """Steps slower than the spin's budget stop the caller's spins; once steps are quick
    again a probe finds it out and the waits spin again (a mean over every wait, slept
    ones included, would stay above the budget where sleeping costs more than it)."""
    envs = make_pipelined([partial(FaultyEnv, sleep_seconds=0.002)])
    worker = workers(envs)[0]
    spin_as_on_a_quiet_machine(worker)
    envs.reset(seed=0)
    normal, sleep = np.array([FaultyEnv.NORMAL]), np.array([FaultyEnv.SLEEP])
    for _ in range(5):
        envs.step(normal)
    for _ in range(2 * PROBE_FIRST):
        envs.step(sleep)
    spins, hits = worker.wire.spins, worker.wire.spin_hits
    for _ in range(4 * PROBE_FIRST):
        envs.step(sleep)
    assert worker.wire.spins - spins <= 3  # slow steps: only probes spin
    for _ in range(4 * PROBE_MAX):
        envs.step(normal)
        if worker.wire.spin_hits - hits > 20:
            break
    assert worker.wire.spin_hits - hits > 20
