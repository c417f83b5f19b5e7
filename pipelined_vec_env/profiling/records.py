"""A profiler recording as plain data: the `Recording` snapshot that the summary, the
Chrome trace and the timeline read, and the readers of its record tuples.

`Profiler` (in `profiling`) records; `Profiler.snapshot()` copies what it holds into a
`Recording`; `profile_summary`, `chrome_trace` and `_timeline` each turn a `Recording`
into one output. None of them sees the profiler itself.

Record tuples, times in ns of `time.monotonic_ns`:

- command: `(worker, command, t_sent, t_start, t_end, t_received, answer_kind)`;
  `t_start` / `t_end` are the worker's own times, None when the answer carried none.
- stage span: `(stage, op, t0, t1)`, a call in flight on a stage.
- step round: `(stage, t0, t_done, durations)`, one stage step: its first send, when
  its last worker finished, and each worker's time inside the step.
- wait: `(name, stage, t0, t1)`, the caller blocked (`stage` None: on any).
- span: `(name, stage, thread_track, t0, t1)`, the caller's own work.
- instant: `(name, worker, t, args)`: a restart, deadline kill or death.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Recording", "busy_ns", "finished_ns", "merged_waits", "placed", "union_ns"]


@dataclass(frozen=True)
class Recording:
    """What a `Profiler` held at one moment (see the module doc for the tuples).

    Attributes:
        commands: Answered commands, in the order their answers arrived.
        stage_spans: Stage calls in flight.
        rounds: Stage step rounds.
        waits: The caller's waits.
        spans: The caller's spans.
        instants: Restarts, deadline kills and deaths.
        windows: Recording windows `(start, end)` in ns, `end` None while recording
            (`pause()` closes one, `resume()` opens the next).
        workers: `{worker: (stage, env_indices)}`.
        threads: `{thread_track: thread_name}`; track 0 is the thread that built the env.
        num_stages: Stages of the registered workers.
        taken_at: When the snapshot was taken (ns); ends the open window.
    """

    commands: tuple[tuple, ...]
    stage_spans: tuple[tuple, ...]
    rounds: tuple[tuple, ...]
    waits: tuple[tuple, ...]
    spans: tuple[tuple, ...]
    instants: tuple[tuple, ...]
    windows: tuple[tuple[int, int | None], ...]
    workers: dict[int, tuple[int, tuple[int, ...]]]
    threads: dict[int, str]
    num_stages: int
    taken_at: int

    @property
    def num_envs(self) -> int:
        """Envs of the registered workers (at least 1)."""
        return sum(len(envs) for _, envs in self.workers.values()) or 1

    def extent(self) -> tuple[int, int]:
        """First and last event time in ns (`taken_at` twice when nothing was recorded)."""
        starts = [r[2] for r in self.commands] + [s[3] for s in self.spans]
        starts += [w[2] for w in self.waits] + [s[2] for s in self.stage_spans]
        ends = [r[5] for r in self.commands] + [s[4] for s in self.spans]
        ends += [w[3] for w in self.waits] + [s[3] for s in self.stage_spans]
        ends += [i[2] for i in self.instants]
        starts += [i[2] for i in self.instants]
        if not starts:
            return self.taken_at, self.taken_at
        return min(starts), max(ends)

    def wall_ns(self) -> int:
        """Recorded time in ns: the extent, less the paused time."""
        lo, hi = self.extent()
        total = 0
        for start, end in self.windows:
            a, b = max(start, lo), min(self.taken_at if end is None else end, hi)
            total += max(0, b - a)
        return total


def merged_waits(waits: Sequence[tuple]) -> list[tuple[str, tuple[int, ...], int, int]]:
    """Caller waits `(name, stage, t0, t1)` merged where they overlap (a whole-env call
    waits for every stage at once): `(name, stages, t0, t1)`, in time order."""
    merged: list[list[Any]] = []
    for name, stage, t0, t1 in sorted(waits, key=lambda w: w[2]):
        if merged and t0 <= merged[-1][3]:
            last = merged[-1]
            last[3] = max(last[3], t1)
            if stage is not None and stage not in last[1]:
                last[1].append(stage)
            continue
        merged.append([name, [] if stage is None else [stage], t0, t1])
    return [(n, tuple(sorted(st)), a, b) for n, st, a, b in merged]


def placed(t_sent: int, t_start: int | None, t_end: int | None, t_recv: int) -> tuple[int, int]:
    """Start and duration (ns) to draw a command at, on the caller's clock.

    The worker's span as measured when it lies inside the round trip; else (a worker
    clock that is not the caller's, e.g. a Ray actor on another node) its duration,
    capped at the round trip, centred in the round trip; the round trip itself when the
    answer carried no worker times.
    """
    if t_start is None or t_end is None:
        return t_sent, t_recv - t_sent
    dur = max(0, t_end - t_start)
    if t_sent <= t_start and t_end <= t_recv:
        return t_start, dur
    dur = min(dur, t_recv - t_sent)
    return t_sent + (t_recv - t_sent - dur) // 2, dur


def busy_ns(command: tuple) -> int:
    """Time inside the worker (the round trip when the answer carried no worker times)."""
    if command[3] is None:
        return command[5] - command[2]
    return command[4] - command[3]


def finished_ns(command: tuple) -> int:
    """When the worker finished the command on the caller's clock (received if unknown)."""
    if command[4] is None:
        return command[5]
    start, dur = placed(command[2], command[3], command[4], command[5])
    return start + dur


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length covered by sorted `(start, end)` intervals."""
    total, start, end = 0, None, None
    for a, b in intervals:
        if end is None or a > end:
            if end is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    return total + (end - start if end is not None else 0)
