"""When either side of the step fast path spins on its slot instead of sleeping.

Waking a sleeping process through a pipe costs tens of microseconds on a VM; seeing a
counter move in shared memory costs well under one (the measured floors in docs/wire_format.md). So the
caller, waiting for an answer, and the worker, waiting for the next command, may spin on
the slot's counters (`slots.StepSlot`) (docs/wire_format.md, "What spins when"):

- the caller for at most `SPIN_SECONDS`, under three gates: `can_spin` at construction
  (every worker and the caller can have a core of its own), `machine_quiet` (the
  machine's load leaves those cores free now) and its `SpinGate` (its recent spun waits
  were short);
- the worker for at most `YIELD_SPIN_SECONDS`, yielding its core at each look
  (`spin_until` with ``yield_core``), where every worker can have a core of its own
  (`can_spin` of the workers alone), while its `SpinGate` (budget `YIELD_SPIN_SECONDS`)
  says its recent spun waits were short; after a whole-env step's sends the caller
  hands its core to such a worker (`hand_over_core`).

The idea of spinning briefly before blocking is EnvPool's (a short spin, then a
semaphore) and torchrl's (spin-polled shared flags with liveness checks, PR #3457).
"""

from __future__ import annotations

import math
import os
import platform
import time
from typing import Any

__all__ = [
    "LOAD_HORIZON_SECONDS",
    "LOAD_SAMPLE_SECONDS",
    "PROBE_FIRST",
    "PROBE_MAX",
    "SPIN_SECONDS",
    "SpinGate",
    "YIELD_SPIN_SECONDS",
    "can_spin",
    "hand_over_core",
    "machine_quiet",
    "spin_until",
    "usable_cores",
]

#: Longest spin (seconds) before sleeping in the kernel; each side spins only while its
#: recent spun waits were shorter than this.
SPIN_SECONDS = 50e-6
#: Longest spin (seconds) that yields its core at each look (`spin_until` with
#: ``yield_core``), either side's; its `SpinGate` keeps it spinning only while its recent
#: spun waits were shorter than this.
YIELD_SPIN_SECONDS = 500e-6
#: Longest spin (seconds) of the caller for the last answers of a call once the first came
#: (`WorkerPool.wait`, where the workers spin), yielding its core at each look.
TAIL_SPIN_SECONDS = 300e-6
#: Waits a closed `SpinGate` lets pass before it spins once to probe again.
PROBE_FIRST = 16
#: The most waits between two probes (the interval doubles after each probe that missed).
PROBE_MAX = 1024


class SpinGate:
    """Whether one side's next wait may spin: while the mean of its recent *spun* waits
    is under the budget (`SPIN_SECONDS` unless given).

    A wait that slept says nothing about how long a spun one would take: it includes the
    sleeper's own wake-up (tens of microseconds here), so a mean over every wait would
    keep a quick worker's round trip (a null env's: 60-70 us asleep, a few us spinning)
    above the budget for good once anything stopped the spins. So only spun waits are
    recorded, and while the gate is closed it opens for one probe after `PROBE_FIRST`
    waits; a probe that comes in under the budget reopens the gate at once, one that
    misses doubles the interval, up to `PROBE_MAX` waits (a 4-env HalfCheetah step,
    ~110 us, then pays one 50 us spin per 1024 waits).

    Args:
        budget: The longest mean (seconds) of spun waits under which the gate stays open.

    Attributes:
        mean: Running mean (seconds) of the recent spun waits, weight 1/4 for the newest.
    """

    __slots__ = ("_every", "_probing", "_until", "budget", "mean")

    def __init__(self, budget: float = SPIN_SECONDS) -> None:
        self.budget = budget
        self.mean = 0.0
        self._every = self._until = PROBE_FIRST
        self._probing = False

    def allows(self) -> bool:
        """Whether the next wait may spin (counts the waits toward the next probe); the
        caller of this must `record` that wait's time if it spins."""
        if self.mean < self.budget:
            return True
        self._until -= 1
        if self._until > 0:
            return False
        self._probing = True
        self._every = min(2 * self._every, PROBE_MAX)
        self._until = self._every
        return True

    def record(self, seconds: float) -> None:
        """Record a spun wait that took ``seconds`` (from the message that started it to
        the one that ended it)."""
        if self._probing:
            self._probing = False
            if seconds < self.budget:  # quick again: trust the probe, not the old mean
                self.mean = seconds
                self._every = self._until = PROBE_FIRST
                return
        self.mean += 0.25 * (min(seconds, 1.0) - self.mean)


def stores_ordered() -> bool:
    """Whether this machine keeps plain stores in order as other cores see them (x86-64):
    then a counter seen moved in shared memory implies the data written before it, which
    every spin on a slot relies on."""
    return platform.machine().lower() in ("x86_64", "amd64")


def can_spin(processes: int) -> bool:
    """Whether ``processes`` busy processes (workers plus the caller) leave a core each
    for spinning without yielding it: at most the cores this process may use, where
    `stores_ordered`."""
    return stores_ordered() and processes <= usable_cores()


#: Seconds between two readings of the tasks runnable now.
LOAD_SAMPLE_SECONDS = 0.1
#: Time constant (seconds) of the running mean of those readings.
LOAD_HORIZON_SECONDS = 2.0
_load_seen = (-1.0, 0.0, 0.0)  # (when, runnable tasks weighted by recency, the weights)


def machine_quiet(own_processes: int) -> bool:
    """Whether the machine's load leaves a core for each of ``own_processes`` (a vector
    env's workers and its caller): the load of other work plus those processes is under
    the usable cores plus half a core.

    The load is a running mean (time constant `LOAD_HORIZON_SECONDS`) of the tasks
    runnable now (``/proc/loadavg``'s fourth field), read every `LOAD_SAMPLE_SECONDS` at
    most (each process keeps its own, weighted as an exponential moving average with its
    start-up bias divided out), less
    ``own_processes``. The kernel's 1-minute average lags a minute both ways: it kept the
    spins off for a minute after a benchmark's 8 busy workers had exited (the one-worker
    null step measured right after them never spun, in the caller nor in a fresh
    worker), and missed a job that had just started. One reading alone is noisy: on an
    idle machine it often catches a kernel thread or a worker on its way back to sleep.
    Spinning on a machine that other work keeps busy takes cores from it (and from our
    own workers), so the spins stop there.
    """
    global _load_seen
    now = time.monotonic()
    when, weighted, weights = _load_seen
    if when < 0 or now - when >= LOAD_SAMPLE_SECONDS:
        # a running mean with its start-up bias divided out (as Adam's moments): until a
        # horizon of readings has come, it is their plain mean, so a first reading taken
        # while our own workers were still starting weighs 1/k after k readings
        decay = 0.0 if when < 0 else math.exp(-(now - when) / LOAD_HORIZON_SECONDS)
        weighted = decay * weighted + _runnable_now()
        weights = decay * weights + 1.0
        _load_seen = (now, weighted, weights)
    load = weighted / weights
    others = max(0.0, load - own_processes)
    return others + own_processes < usable_cores() + 0.5


def _runnable_now() -> float:
    """The tasks runnable now (the 1-minute load average where /proc is missing)."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; the CPU count elsewhere)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - platforms without affinity


def hand_over_core(profiler: Any = None) -> None:
    """Let a task waiting for this core run now (``sched_yield``; nothing where missing);
    with a ``profiler`` (the vector env's, when profiling is on), record the time until
    the caller had its core back as a caller wait named ``hand-over``.

    Called by the caller right after it sent a whole-env step to workers that spin for
    it: a spinning worker that shares the caller's core would otherwise start its step
    only once the caller goes to sleep in its wait, tens of microseconds of Python later
    (measured with the profiler's records, 2 workers of 4 HalfCheetah envs on 2 cores:
    send-to-start 13.7 -> 7.1 us, the worker's step 155 -> 130 us, 33.2k -> 35.5k env
    steps/s, median of 4 interleaved runs). Where nothing else waits for the core it
    returns at once. Not after one stage's ``step_async``: there the caller has other
    stages to serve, and handing its core to a worker can stall it behind that worker's
    whole step (the staged 2x4 loop: 29.7k env steps/s with it, 32.2k without, median of
    4 interleaved runs on a noisy machine). After an EnvPool-style ``send`` of whole
    workers only while their steps are quick (`stepping.decoupled.HAND_OVER_SECONDS`).
    """
    t0 = time.monotonic_ns() if profiler is not None else 0
    if hasattr(os, "sched_yield"):
        os.sched_yield()
    if profiler is not None:  # the caller gave its core away: a wait
        profiler.caller_waited("hand-over", t0)


def spin_until(
    ready: Any,
    seconds: float,
    alive: Any = None,
    check_every: int = 64,
    yield_core: bool = False,
) -> bool:
    """Spin until ``ready()`` is true, at most ``seconds``; return whether it became so.

    Args:
        ready: A cheap test (reads shared memory).
        seconds: The spin's budget.
        alive: Called every ``check_every`` spins; the spin stops when it returns False.
        check_every: Spins between liveness checks.
        yield_core: Give the core away (``sched_yield``) after each test, so that any
            task runnable on it runs first: the spin then takes only CPU time nothing
            else wants, and may run where no core is free.
    """
    end = time.perf_counter() + seconds
    if yield_core and hasattr(os, "sched_yield"):
        sched_yield, clock = os.sched_yield, time.perf_counter
        spins = 0
        while True:
            if ready():
                return True
            sched_yield()
            spins += 1
            if clock() >= end or (alive is not None and spins % check_every == 0 and not alive()):
                return ready()
    spins = 0
    while True:
        if ready():
            return True
        spins += 1
        if spins % check_every == 0:
            if alive is not None and not alive():
                return False
            if time.perf_counter() >= end:
                return False
