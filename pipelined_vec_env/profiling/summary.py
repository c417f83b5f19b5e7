"""Where a recording's time went: per stage and per worker, the bottleneck in words and
the speed other layouts would reach.

`summarize` reads a `Recording` (`profile_records`) and returns the dict that
`Profiler.summary()` documents. Time is classified as stepping (inside a worker's
command), transport (sent until the worker started, and the way back while the caller
waited), the caller's waits, and its busy time (inference spans and the rest).

The overlap bound follows the design notes: with env time `Te` and policy time `Ti` per
round, a serial loop costs `Te + Ti` and an ideal pipeline `max(Te, Ti)`.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from .records import Recording, busy_ns, merged_waits, placed, union_ns

__all__ = ["BOTTLENECKS", "summarize"]

#: The bottleneck classes `summarize` chooses from.
BOTTLENECKS = ("env", "policy", "transport", "straggler")

# a step round is a straggler round when the stage waited this share of it for its slowest
# worker; transport dominates when it is this share of the round trips
_STRAGGLER_SHARE = 0.3
_TRANSPORT_SHARE = 0.5
# caller busy and envs occupied within this of each other: say that overlap can help
_BALANCED = 0.15


def summarize(recording: Recording) -> dict[str, Any]:
    """Where the time of `recording` went, and what limits the speed.

    Args:
        recording: A profiler's snapshot (`Profiler.snapshot()`).

    Returns:
        A dict (JSON-ready, keys sorted; seconds are floats):

        - `wall_s`: recorded time, from the first event to the last (paused time
          left out).
        - `stages`: per stage (keys `"0"`, `"1"` ...): `env_busy_fraction`
          (mean over the stage's workers of the share of `wall_s` spent inside
          commands, in [0, 1]), `caller_wait_s` (the caller blocked waiting for the
          stage), `inference_s` (spans named `"inference"` with that stage; with one
          stage also those with `stage=None`), `policy_idle_fraction`
          (`1 - inference_s / wall_s`, the trainer's bubble), `step_rounds`,
          `round_s` (mean step latency of the stage: its first send until its
          last worker finished) and `straggler_fraction` (mean share of a step
          round that the stage waited for its slowest worker).
        - `workers`: per worker: `stage`, `commands`, `step_p50_s`,
          `step_p99_s` (time inside the worker per step command; the round trip
          when the answer carried no worker times), `transport_overhead_s` (mean
          per command of the way there, sent until the worker started, plus the way
          back while the caller was waiting: pickling, the pipe, wake-ups; an answer
          left in the pipe while the caller did other work does not count; None
          without worker times) and `busy_fraction`.
        - `transport_fraction`: transport's share of transport plus worker time.
        - `caller_wait_s`, `inference_s` and `policy_idle_fraction` over all
          stages; `caller_busy_fraction` (share of `wall_s` not spent waiting).
        - `bottleneck`: one of `"env"`, `"policy"`, `"transport"`,
          `"straggler"`, and `bottleneck_reason`: a sentence saying why.
        - `predicted_speedup`: `{"stages": {"1": x, "2": y, "4": z},
          "decoupled": w, "env_s": Te, "policy_s": Ti, "current_stages": K}`: speed
          relative to the recorded layout from the overlap bound, with `Te` the
          measured stage step latency and `Ti` the caller's busy time per round
          (see docs/profiling.md for the model and its assumptions).
    """
    wall = recording.wall_ns()
    per = max(wall, 1)
    commands = list(recording.commands)
    by_worker: dict[int, list[tuple]] = {w: [] for w in recording.workers}
    for r in commands:
        by_worker.setdefault(r[0], []).append(r)
    workers: dict[str, dict[str, Any]] = {}
    busy_frac: dict[int, float] = {}
    transport_ns = worked_ns = 0
    waits = list(recording.waits)
    merged = merged_waits(waits)
    for w, records in sorted(by_worker.items()):
        steps = [r for r in records if r[1] == "step"]
        step_times = np.array([busy_ns(r) for r in steps], dtype=np.float64) / 1e9
        overhead = _transport(records, merged)
        transport_ns += sum(overhead)
        worked_ns += sum(busy_ns(r) for r in records if r[3] is not None)
        busy_frac[w] = min(1.0, sum(busy_ns(r) for r in records) / per)
        workers[str(w)] = {
            "stage": recording.workers.get(w, (0, ()))[0],
            "commands": len(records),
            "step_p50_s": float(np.percentile(step_times, 50)) if len(steps) else None,
            "step_p99_s": float(np.percentile(step_times, 99)) if len(steps) else None,
            "transport_overhead_s": float(np.mean(overhead)) / 1e9 if overhead else None,
            "busy_fraction": busy_frac[w],
        }
    num_stages = max(recording.num_stages, 1)
    inference_all = sum(s[4] - s[3] for s in recording.spans if s[0] == "inference")
    caller_wait = sum(t1 - t0 for _, _, t0, t1 in merged)
    result: dict[str, Any] = {
        "wall_s": wall / 1e9,
        "stages": _stages(recording, busy_frac, per),
        "workers": workers,
        "caller_wait_s": caller_wait / 1e9,
        "caller_busy_fraction": max(0.0, 1.0 - caller_wait / per),
        "inference_s": inference_all / 1e9,
        "policy_idle_fraction": max(0.0, 1.0 - inference_all / per),
        "transport_fraction": (
            transport_ns / (transport_ns + worked_ns) if transport_ns + worked_ns else None
        ),
        "clock": "CLOCK_MONOTONIC (time.monotonic_ns)",
    }
    result["predicted_speedup"] = _predict(recording, result, num_stages, wall)
    kind, reason = _classify(recording, result, busy_frac)
    result["bottleneck"] = kind
    result["bottleneck_reason"] = reason
    return dict(sorted(result.items()))


def _stages(
    recording: Recording, busy_frac: dict[int, float], per: int
) -> dict[str, dict[str, Any]]:
    """The per-stage part of the summary (`per`: the wall time in ns, at least 1)."""
    num_stages = max(recording.num_stages, 1)
    stages: dict[str, dict[str, Any]] = {}
    for s in range(num_stages):
        mine = [w for w, (st, _) in recording.workers.items() if st == s]
        inference = sum(
            t1 - t0
            for name, stage, _, t0, t1 in recording.spans
            if name == "inference" and (stage == s or (stage is None and num_stages == 1))
        )
        stage_rounds = [r for r in recording.rounds if r[0] == s]
        stages[str(s)] = {
            "env_busy_fraction": float(np.mean([busy_frac[w] for w in mine])) if mine else 0.0,
            "caller_wait_s": sum(t1 - t0 for _, st, t0, t1 in recording.waits if st == s) / 1e9,
            "inference_s": inference / 1e9,
            "policy_idle_fraction": max(0.0, 1.0 - inference / per),
            "step_rounds": len(stage_rounds),
            "round_s": (
                float(np.mean([t1 - t0 for _, t0, t1, _ in stage_rounds])) / 1e9
                if stage_rounds
                else None
            ),
            "straggler_fraction": (
                float(np.mean([_straggle(d) for *_, d in stage_rounds])) if stage_rounds else 0.0
            ),
        }
    return stages


def _predict(recording: Recording, result: dict[str, Any], k: int, wall: int) -> dict[str, Any]:
    """Speed of other layouts relative to this one from the overlap bound.

    Per round of all envs: env latency `e` (a stage's step round, independent of how
    many envs the stage has, i.e. enough cores for all workers) and caller time `p`
    (all it does outside waits, or the time some inference span ran if longer, as
    with inference on actor threads; split evenly over stages). K stages cost
    `max(p, e + p / K)` per round (K = 1: the serial `e + p`); decoupled mode
    `max(p, e)`.
    """
    rounds = recording.rounds
    steps = [r for r in recording.commands if r[1] == "step"]
    if rounds:
        e = float(np.mean([t1 - t0 for _, t0, t1, _ in rounds]))
        full_rounds = len(rounds) / k
    elif steps:
        e = float(np.mean([r[5] - r[2] for r in steps]))
        full_rounds = len(steps) / max(len(recording.workers), 1)
    else:
        return {
            "stages": {},
            "decoupled": None,
            "env_s": None,
            "policy_s": None,
            "current_stages": k,
        }
    caller = max(wall - result["caller_wait_s"] * 1e9, _inference_union(recording) * wall)
    p = max(0.0, caller) / max(full_rounds, 1e-9)

    def cost(stages: int | None) -> float:
        return max(p, e) if stages is None else max(p, e + p / stages)

    here = cost(k)
    counts = sorted({1, 2, 4, k})
    return {
        "stages": {str(n): here / cost(n) for n in counts if n <= recording.num_envs},
        "decoupled": here / cost(None),
        "env_s": e / 1e9,
        "policy_s": p / 1e9,
        "current_stages": k,
    }


def _classify(
    recording: Recording, result: dict[str, Any], busy_frac: dict[int, float]
) -> tuple[str, str]:
    """The bottleneck, one of `BOTTLENECKS`, and a sentence saying why."""
    wall = result["wall_s"]
    if not recording.commands:
        return (
            "policy",
            "no worker commands were recorded: the caller never waited on the envs.",
        )
    waiting = 1.0 - result["caller_busy_fraction"]
    inference = 1.0 - result["policy_idle_fraction"]
    # the policy's share: the caller's busy time, or (inference on actor threads, as
    # in an InferenceChannel whose driver mostly waits) the time some inference ran
    busy = max(result["caller_busy_fraction"], _inference_union(recording))
    env_busy = float(np.mean(list(busy_frac.values()))) if busy_frac else 0.0
    occupied = _occupancy(recording)
    transport = result["transport_fraction"]
    straggle = max((s["straggler_fraction"] for s in result["stages"].values()), default=0.0)
    p50 = [w["step_p50_s"] for w in result["workers"].values() if w["step_p50_s"] is not None]
    step = f"{1e3 * float(np.median(p50)):.3g} ms" if p50 else "n/a"
    facts = (
        f"over {wall:.3g} s the caller waited {waiting:.0%} of the time and the policy side "
        f"was busy {busy:.0%} (inference {inference:.0%}); env workers were stepping "
        f"{env_busy:.0%} of the time and had a command in flight {occupied:.0%} "
        f"(median step {step})"
    )
    if abs(busy - occupied) < _BALANCED:
        gain = result["predicted_speedup"]["decoupled"] or 1.0
        facts += (
            "; the caller and the envs take about as long, so more overlap could run up to "
            f"{gain:.2f}x this layout's speed (predicted for decoupled mode; more stages "
            "gain less)"
        )
    if busy >= occupied:
        return "policy", (
            f"policy: {facts}. The envs wait for the caller: a faster policy (or more "
            "envs per inference batch) raises throughput; more env workers do not."
        )
    if transport is not None and transport >= _TRANSPORT_SHARE:
        return "transport", (
            f"transport: {facts}; {transport:.0%} of each command's round trip is spent "
            "outside the env (pickling, the pipe, waking processes). Use shared-memory "
            "observations, smaller observations or more envs_per_worker."
        )
    if straggle >= _STRAGGLER_SHARE:
        slow = max(result["workers"].items(), key=lambda kv: kv[1]["step_p50_s"] or 0.0)[0]
        return "straggler", (
            f"straggler: {facts}; in an average step round a stage waited {straggle:.0%} "
            f"of the round for its slowest worker (slowest median: worker {slow}). "
            "Balance the envs over workers, or step with send/recv (decoupled mode) so "
            "that fast envs do not wait for slow ones."
        )
    return "env", (
        f"env: {facts}. The simulators are the limit: faster or more parallel env "
        "steps raise throughput; overlap (stages) can hide at most the caller's "
        f"{busy:.0%}."
    )


def _inference_union(recording: Recording) -> float:
    """Share of wall time during which some thread ran an `"inference"` span."""
    spans = sorted((s[3], s[4]) for s in recording.spans if s[0] == "inference")
    return min(1.0, union_ns(spans) / max(recording.wall_ns(), 1))


def _occupancy(recording: Recording) -> float:
    """Mean over workers of the share of wall time with a command in flight."""
    per = max(recording.wall_ns(), 1)
    by_worker: dict[int, list[tuple[int, int]]] = {}
    for r in recording.commands:
        by_worker.setdefault(r[0], []).append((r[2], r[5]))
    if not by_worker:
        return 0.0
    fractions = [min(1.0, union_ns(sorted(iv)) / per) for iv in by_worker.values()]
    return float(np.mean(fractions))


def _transport(records: list[tuple], waits: list[tuple[str, tuple, int, int]]) -> list[int]:
    """Transport time of each timed command of one worker (records in send order):
    the way there (sent until the worker started, less any time the worker spent on an
    earlier command) plus the way back while the caller was waiting for answers (an
    answer left in the pipe while the caller did other work is not transport)."""
    starts = [w[2] for w in waits]
    out = []
    previous_end = None
    for r in records:
        if r[3] is None:
            continue
        start, dur = placed(r[2], r[3], r[4], r[5])
        ready = r[2] if previous_end is None else max(r[2], previous_end)
        there = max(0, start - ready)
        previous_end = start + dur
        back, a, b = 0, previous_end, r[5]
        i = max(0, bisect.bisect_right(starts, a) - 1)
        while i < len(waits) and waits[i][2] < b:
            back += max(0, min(b, waits[i][3]) - max(a, waits[i][2]))
            i += 1
        out.append(there + back)
    return out


def _straggle(durations: list[int]) -> float:
    """Share of a step round the stage waited for its slowest worker."""
    top = max(durations)
    return 0.0 if top <= 0 else 1.0 - float(np.mean(durations)) / top
