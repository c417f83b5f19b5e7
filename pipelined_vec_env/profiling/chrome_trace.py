"""A recording as a Chrome trace: the JSON that Perfetto UI (ui.perfetto.dev) and
chrome://tracing open.

`build_trace` turns a `Recording` (`profile_records`) into `{"traceEvents": [...]}`:
complete events (`"ph": "X"`, `ts` and `dur` in microseconds from the first event) on
one track per worker (its commands as the worker ran them, the round trip in `args`),
per stage (calls in flight) and for the caller (spans and waits, one track per thread),
with process and thread name metadata; restarts, deadline kills and deaths are instant
events on the worker's track. A worker span whose clock is not the caller's is centred
in its round trip and marked `"clock": "shifted"` (see `placed`). The event format is
Google's Trace Event Format.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from .records import Recording, merged_waits, placed

__all__ = ["build_trace", "write_trace"]

# the trace's processes: one per kind of track
_CALLER, _STAGES, _WORKERS = 1, 2, 3


def build_trace(recording: Recording) -> dict[str, Any]:
    """The Chrome trace dict of `recording` (see the module doc for its layout).

    Args:
        recording: A profiler's snapshot (`Profiler.snapshot()`).

    Returns:
        `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"clock": ...,
        "origin_ns": t}}`, `t` the first event's `time.monotonic_ns` value.
    """
    origin = recording.extent()[0]

    def us(t: int) -> float:
        return (t - origin) / 1e3

    events = _metadata(recording)
    for name, stage, tid, t0, t1 in recording.spans:
        events.append(_complete(name, "span", _CALLER, tid, us(t0), (t1 - t0) / 1e3, stage=stage))
    # the caller's waits go on track 0, the thread that built (and drives) the env
    for name, stages, t0, t1 in merged_waits(recording.waits):
        label = name + "".join(f" stage {s}" for s in stages)
        events.append(
            _complete(label, "wait", _CALLER, 0, us(t0), (t1 - t0) / 1e3, stages=list(stages))
        )
    for stage, op, t0, t1 in recording.stage_spans:
        events.append(_complete(op, "stage", _STAGES, stage, us(t0), (t1 - t0) / 1e3))
    for worker, command, t_sent, t_start, t_end, t_recv, kind in recording.commands:
        rtt = (t_recv - t_sent) / 1e3
        args: dict[str, Any] = {"round_trip_us": rtt, "answer": kind}
        if t_start is None or t_end is None:
            events.append(_complete(command, "command", _WORKERS, worker, us(t_sent), rtt, **args))
            continue
        start, dur = placed(t_sent, t_start, t_end, t_recv)
        if start != t_start:
            args["clock"] = "shifted"
        args["sent_to_start_us"] = (start - t_sent) / 1e3
        args["end_to_received_us"] = (t_recv - start - dur) / 1e3
        events.append(_complete(command, "command", _WORKERS, worker, us(start), dur / 1e3, **args))
    for name, worker, t, args in recording.instants:
        events.append(
            {
                "name": name,
                "cat": "event",
                "ph": "i",
                "s": "t",
                "pid": _WORKERS,
                "tid": worker,
                "ts": us(t),
                "args": args,
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"clock": "CLOCK_MONOTONIC", "origin_ns": origin},
    }


def write_trace(recording: Recording, path: str | Path) -> Path:
    """Write `build_trace(recording)` as JSON to `path` and return the path."""
    path = Path(path)
    path.write_text(json.dumps(build_trace(recording)))
    return path


def _metadata(recording: Recording) -> list[dict[str, Any]]:
    """Process and thread names and sort orders: caller threads, stages, workers."""
    events = [
        _meta("process_name", _CALLER, 0, name="caller"),
        _meta("process_name", _STAGES, 0, name="stages"),
        _meta("process_name", _WORKERS, 0, name="workers"),
    ]
    for pid in (_CALLER, _STAGES, _WORKERS):
        events.append(_meta("process_sort_index", pid, 0, sort_index=pid))
    threads = sorted(recording.threads.items()) or [(0, threading.main_thread().name)]
    if not any(t == 0 for t, _ in threads):
        threads.insert(0, (0, "caller"))
    for tid, name in threads:
        events.append(_meta("thread_name", _CALLER, tid, name=f"caller ({name})"))
    for s in range(max(recording.num_stages, 1)):
        events.append(_meta("thread_name", _STAGES, s, name=f"stage {s}"))
        events.append(_meta("thread_sort_index", _STAGES, s, sort_index=s))
    for w, (s, envs) in sorted(recording.workers.items()):
        label = f"worker {w} (stage {s}, envs {envs[0]}-{envs[-1]})" if envs else f"worker {w}"
        events.append(_meta("thread_name", _WORKERS, w, name=label))
        events.append(_meta("thread_sort_index", _WORKERS, w, sort_index=w))
    return events


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _complete(
    name: str, cat: str, pid: int, tid: int, ts: float, dur: float, **args: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": max(dur, 0.0),
        "args": {k: v for k, v in args.items() if v is not None},
    }
