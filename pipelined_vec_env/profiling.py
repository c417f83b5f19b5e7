"""Where the rollout's time goes: a pipeline profiler with a Chrome trace, a timeline
picture and the bottleneck in words.

``PipelinedVectorEnv(..., profile=True)`` records every worker command: when the caller
sent it, when the worker started and finished it (timestamps taken inside the worker and
carried on its answer), and when the caller received the answer; each stage's calls in
flight; the caller's waits; restarts, deadline kills and deaths as instant events. The
caller adds its own work with ``envs.profiler.span(name, stage)``; spans named
``"inference"`` are the policy's share.

The worker layer calls a narrow set of record methods (``command_sent``,
``answer_received``, ``worker_restarted``, ``deadline_kill``, ``worker_died``,
``stage_started``, ``wait_started``, ``stage_finished``, ``caller_waited``); nothing else
in this module knows how workers are reached, so a future worker pool can call the same
methods.

Clock: ``time.monotonic_ns`` everywhere. On Linux it reads ``CLOCK_MONOTONIC``, one clock
for every process of a machine, so the caller's and the workers' timestamps are
comparable. A worker timestamp outside its command's round trip (a Ray actor on another
node, whose monotonic clock counts from another boot) is not trusted as a position: the
worker's span keeps its measured duration and is centred in the round trip, marked
``"clock": "shifted"`` in the trace.

The overlap bound follows the design notes: with env time ``Te`` and policy time ``Ti`` per
round, a serial loop costs ``Te + Ti`` and an ideal pipeline ``max(Te, Ti)``.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BOTTLENECKS", "Profiler", "ProfilingDisabledError"]

#: The bottleneck classes ``summary()`` chooses from.
BOTTLENECKS = ("env", "policy", "transport", "straggler")

#: Commands without an answer: never recorded (nothing would close them).
_NO_ANSWER = frozenset({"attach", "set_autoreset", "close"})

# a step round is a straggler round when the stage waited this share of it for its slowest
# worker; transport dominates when it is this share of the round trips
_STRAGGLER_SHARE = 0.3
_TRANSPORT_SHARE = 0.5
# caller busy and envs occupied within this of each other: say that overlap can help
_BALANCED = 0.15


class ProfilingDisabledError(RuntimeError):
    """An export or summary was asked of a vector env built without ``profile=True``."""


def _now() -> int:
    return time.monotonic_ns()


class Profiler:
    """Records a vector env's worker commands and the caller's spans (see the module doc).

    Every ``PipelinedVectorEnv`` has one as ``envs.profiler`` (``envs.unwrapped.profiler``
    through wrappers). With ``enabled=False`` the record methods are never called,
    ``span()`` does nothing and the exports raise ``ProfilingDisabledError``.

    Args:
        enabled: Record (``profile=True`` of the vector env).
        max_records: Most commands kept (older ones are dropped, as are the oldest spans
            past the same bound); about 200 bytes each.

    Examples:
        >>> import gymnasium as gym
        >>> from pipelined_vec_env import PipelinedVectorEnv
        >>> envs = PipelinedVectorEnv([lambda: gym.make("CartPole-v1")] * 2, profile=True)
        >>> _ = envs.reset(seed=0)
        >>> with envs.profiler.span("inference"):
        ...     actions = envs.action_space.sample()
        >>> _ = envs.step(actions)
        >>> sorted(envs.profiler.summary())[:3]
        ['bottleneck', 'bottleneck_reason', 'caller_busy_fraction']
        >>> envs.close()
    """

    def __init__(self, enabled: bool = False, max_records: int = 500_000) -> None:
        if not isinstance(max_records, int) or max_records < 1:
            raise ValueError(f"max_records: expected an int >= 1, got {max_records!r}")
        self.enabled = bool(enabled)
        self.max_records = max_records
        self.num_stages = 0
        self._workers: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._lock = threading.Lock()
        # track 0: the thread that built the env (it drives it: its waits go there too)
        self._threads: dict[int, tuple[int, str]] = {
            threading.get_ident(): (0, threading.current_thread().name)
        }
        self.clear()

    # ------------------------------------------------------------------ set-up

    def clear(self) -> None:
        """Forget everything recorded so far (commands in flight stay tracked)."""
        n = self.max_records
        # (worker, command, t_sent, t_start, t_end, t_received, kind)
        self._commands: deque[tuple[int, str, int, int | None, int | None, int, str]] = deque(
            maxlen=n
        )
        self._stage_spans: deque[tuple[int, str, int, int]] = deque(maxlen=n)
        self._rounds: deque[tuple[int, int, int, list[int]]] = deque(maxlen=n)
        self._waits: deque[tuple[str, int | None, int, int]] = deque(maxlen=n)
        self._spans: deque[tuple[str, int | None, int, int, int]] = deque(maxlen=n)
        self._instants: deque[tuple[str, int, int, dict[str, Any]]] = deque(maxlen=n)
        self._stage_open: dict[int, tuple[str, int]] = {}
        self._wait_open: dict[int, int] = {}
        self._last: dict[int, tuple[int, str, int, int | None, int | None, int, str]] = {}
        if not hasattr(self, "_pending"):
            self._pending: dict[int, deque[tuple[str, int, bool]]] = {}
        self._windows: list[list[int | None]] = [[_now(), None]] if self.enabled else []

    def add_worker(self, index: int, stage: int, env_indices: Sequence[int]) -> None:
        """Register worker ``index`` of ``stage`` serving the global envs ``env_indices``."""
        self._workers[index] = (stage, tuple(env_indices))
        self._pending.setdefault(index, deque())
        self.num_stages = max(self.num_stages, stage + 1)

    @property
    def recording(self) -> bool:
        """Whether events are being kept now (enabled and not paused)."""
        return bool(self._windows) and self._windows[-1][1] is None

    def pause(self) -> None:
        """Stop keeping events (e.g. during a PPO update); ``summary()`` leaves the paused
        time out of ``wall_s``. Commands in flight stay tracked."""
        if self.recording:
            self._windows[-1][1] = _now()

    def resume(self) -> None:
        """Keep events again after ``pause()``."""
        if self.enabled and not self.recording:
            self._windows.append([_now(), None])

    # ------------------------------------------------------------------ record methods
    # called by the worker layer (only when enabled)

    def command_sent(self, worker: int, command: str) -> None:
        """Worker ``worker`` was just sent ``command`` (answered commands only matter)."""
        if command in _NO_ANSWER:
            return
        self._pending.setdefault(worker, deque()).append((command, _now(), self.recording))

    def answer_received(self, worker: int, kind: str, times: tuple[int, int] | None) -> None:
        """The answer to ``worker``'s oldest command arrived.

        Args:
            worker: Worker index.
            kind: ``"ok"``, ``"error"``, ``"ready"`` ...
            times: ``(started, finished)`` in the worker, ``time.monotonic_ns`` values, or
                None when the answer carries none.
        """
        t_received = _now()
        queue = self._pending.get(worker)
        if not queue:
            return  # an answer we did not see sent (a start-up ``ready``)
        command, t_sent, keep = queue.popleft()
        if not keep or not self.recording:
            return
        t_start, t_end = times if times is not None else (None, None)
        record = (worker, command, t_sent, t_start, t_end, t_received, kind)
        self._commands.append(record)
        self._last[worker] = record

    def worker_restarted(self, worker: int) -> None:
        """Worker ``worker``'s process is being replaced: its commands in flight are lost;
        its start-up (until ``ready``) is recorded as a ``start`` command."""
        self._pending.setdefault(worker, deque()).clear()
        self._instant("restart", worker)
        self._pending[worker].append(("start", _now(), self.recording))

    def deadline_kill(self, worker: int) -> None:
        """Worker ``worker`` is being killed for overrunning ``step_deadline``."""
        self._instant("deadline kill", worker)

    def worker_died(self, worker: int, exitcode: Any) -> None:
        """Worker ``worker`` was found dead (exit code ``exitcode``)."""
        self._pending.setdefault(worker, deque()).clear()
        self._instant("died", worker, exitcode=exitcode)

    def stage_started(self, stage: int, op: str) -> None:
        """A call ``op`` is now in flight on ``stage`` (its commands were just sent)."""
        now = _now()
        sent = [
            q[-1][1]
            for w, (s, _) in self._workers.items()
            if s == stage
            for q in [self._pending[w]]
            if q
        ]
        self._stage_open[stage] = (op, min(sent, default=now))

    def wait_started(self, stage: int) -> None:
        """The caller starts waiting for ``stage``'s call in flight."""
        self._wait_open[stage] = _now()

    def stage_finished(self, stage: int) -> None:
        """``stage``'s call in flight completed and was handed to the caller."""
        now = _now()
        opened = self._stage_open.pop(stage, None)
        waited = self._wait_open.pop(stage, None)
        if not self.recording:
            return
        if waited is not None:
            self._waits.append(("wait", stage, waited, now))
        if opened is None:
            return
        op, t0 = opened
        self._stage_spans.append((stage, op, t0, now))
        if op != "step":
            return
        durations, done = [], t0
        for w, (s, _) in self._workers.items():
            record = self._last.get(w)
            if s == stage and record is not None and record[1] == "step" and record[2] >= t0:
                durations.append(_busy(record))
                done = max(done, _finished(record))
        if durations:
            self._rounds.append((stage, t0, done, durations))

    def caller_waited(self, name: str, t0: int, stage: int | None = None) -> None:
        """The caller waited from ``t0`` (``time.monotonic_ns``) until now, e.g. in
        ``recv`` or ``wait_any``; ``stage`` is what it waited for (None: any)."""
        if self.recording:
            self._waits.append((name, stage, t0, _now()))

    def _instant(self, name: str, worker: int, **args: Any) -> None:
        if self.recording:
            self._instants.append((name, worker, _now(), args))

    # ------------------------------------------------------------------ caller spans

    @contextlib.contextmanager
    def span(self, name: str, stage: int | None = None) -> Iterator[None]:
        """Time the caller's own work, e.g. ``with envs.profiler.span("inference", stage=s):``.

        Spans named ``"inference"`` count as the policy's time in ``summary()``. Spans
        from other threads get their own track. With profiling off this does nothing.

        Args:
            name: What the caller is doing.
            stage: The stage it is for, or None.
        """
        if not self.enabled:
            yield
            return
        t0 = _now()
        try:
            yield
        finally:
            if self.recording:
                self._spans.append((name, stage, self._thread_track(), t0, _now()))

    def _thread_track(self) -> int:
        ident = threading.get_ident()
        track = self._threads.get(ident)
        if track is None:
            with self._lock:
                track = self._threads.setdefault(
                    ident, (len(self._threads), threading.current_thread().name)
                )
        return track[0]

    # ------------------------------------------------------------------ analysis

    def _require(self, what: str) -> None:
        if not self.enabled:
            raise ProfilingDisabledError(
                f"profiler.{what}: profiling is off; build the vector env with profile=True "
                "(PipelinedVectorEnv(..., profile=True) or make_vec(..., profile=True))"
            )

    def _extent(self) -> tuple[int, int]:
        starts = [r[2] for r in self._commands] + [s[3] for s in self._spans]
        starts += [w[2] for w in self._waits] + [s[2] for s in self._stage_spans]
        ends = [r[5] for r in self._commands] + [s[4] for s in self._spans]
        ends += [w[3] for w in self._waits] + [s[3] for s in self._stage_spans]
        ends += [i[2] for i in self._instants]
        starts += [i[2] for i in self._instants]
        if not starts:
            now = _now()
            return now, now
        return min(starts), max(ends)

    def _wall_ns(self) -> int:
        lo, hi = self._extent()
        now = _now()
        total = 0
        for start, end in self._windows:
            a, b = max(start, lo), min(now if end is None else end, hi)
            total += max(0, b - a)
        return total

    def summary(self) -> dict[str, Any]:
        """Where the time went, per stage and per worker, and what limits the speed.

        Returns:
            A dict (JSON-ready; seconds are floats):

            - ``wall_s``: recorded time, from the first event to the last (paused time
              left out).
            - ``stages``: per stage (keys ``"0"``, ``"1"`` ...): ``env_busy_fraction``
              (mean over the stage's workers of the share of ``wall_s`` spent inside
              commands, in [0, 1]), ``caller_wait_s`` (the caller blocked waiting for the
              stage), ``inference_s`` (spans named ``"inference"`` with that stage; with one
              stage also those with ``stage=None``), ``policy_idle_fraction``
              (``1 - inference_s / wall_s``, the trainer's bubble), ``step_rounds``,
              ``round_s`` (mean step latency of the stage: its first send until its
              last worker finished) and ``straggler_fraction`` (mean share of a step
              round that the stage waited for its slowest worker).
            - ``workers``: per worker: ``stage``, ``commands``, ``step_p50_s``,
              ``step_p99_s`` (time inside the worker per step command; the round trip
              when the answer carried no worker times), ``transport_overhead_s`` (mean
              per command of the way there, sent until the worker started, plus the way
              back while the caller was waiting: pickling, the pipe, wake-ups; an answer
              left in the pipe while the caller did other work does not count; None
              without worker times) and ``busy_fraction``.
            - ``transport_fraction``: transport's share of transport plus worker time.
            - ``caller_wait_s``, ``inference_s`` and ``policy_idle_fraction`` over all
              stages; ``caller_busy_fraction`` (share of ``wall_s`` not spent waiting).
            - ``bottleneck``: one of ``"env"``, ``"policy"``, ``"transport"``,
              ``"straggler"``, and ``bottleneck_reason``: a sentence saying why.
            - ``predicted_speedup``: ``{"stages": {"1": x, "2": y, "4": z},
              "decoupled": w, "env_s": Te, "policy_s": Ti, "current_stages": K}``: speed
              relative to the recorded layout from the overlap bound, with ``Te`` the
              measured stage step latency and ``Ti`` the caller's busy time per round
              (see docs/profiling.md for the model and its assumptions).

        Raises:
            ProfilingDisabledError: Profiling is off.
        """
        self._require("summary()")
        wall = self._wall_ns()
        wall_s = wall / 1e9
        per = max(wall, 1)
        commands = list(self._commands)
        by_worker: dict[int, list[tuple]] = {w: [] for w in self._workers}
        for r in commands:
            by_worker.setdefault(r[0], []).append(r)
        workers: dict[str, dict[str, Any]] = {}
        busy_frac: dict[int, float] = {}
        transport_ns = worked_ns = 0
        waits = list(self._waits)
        merged = merged_waits(waits)
        for w, records in sorted(by_worker.items()):
            steps = [r for r in records if r[1] == "step"]
            step_times = np.array([_busy(r) for r in steps], dtype=np.float64) / 1e9
            overhead = _transport(records, merged)
            transport_ns += sum(overhead)
            worked_ns += sum(_busy(r) for r in records if r[3] is not None)
            busy_frac[w] = min(1.0, sum(_busy(r) for r in records) / per)
            workers[str(w)] = {
                "stage": self._workers.get(w, (0, ()))[0],
                "commands": len(records),
                "step_p50_s": float(np.percentile(step_times, 50)) if len(steps) else None,
                "step_p99_s": float(np.percentile(step_times, 99)) if len(steps) else None,
                "transport_overhead_s": float(np.mean(overhead)) / 1e9 if overhead else None,
                "busy_fraction": busy_frac[w],
            }
        num_stages = max(self.num_stages, 1)
        spans = list(self._spans)
        inference_all = sum(s[4] - s[3] for s in spans if s[0] == "inference")
        stages: dict[str, dict[str, Any]] = {}
        rounds = list(self._rounds)
        for s in range(num_stages):
            mine = [w for w, (st, _) in self._workers.items() if st == s]
            inference = sum(
                t1 - t0
                for name, stage, _, t0, t1 in spans
                if name == "inference" and (stage == s or (stage is None and num_stages == 1))
            )
            stage_rounds = [r for r in rounds if r[0] == s]
            stages[str(s)] = {
                "env_busy_fraction": float(np.mean([busy_frac[w] for w in mine])) if mine else 0.0,
                "caller_wait_s": sum(t1 - t0 for _, st, t0, t1 in waits if st == s) / 1e9,
                "inference_s": inference / 1e9,
                "policy_idle_fraction": max(0.0, 1.0 - inference / per),
                "step_rounds": len(stage_rounds),
                "round_s": (
                    float(np.mean([t1 - t0 for _, t0, t1, _ in stage_rounds])) / 1e9
                    if stage_rounds
                    else None
                ),
                "straggler_fraction": (
                    float(np.mean([_straggle(d) for *_, d in stage_rounds]))
                    if stage_rounds
                    else 0.0
                ),
            }
        caller_wait = sum(t1 - t0 for _, _, t0, t1 in merged)
        result: dict[str, Any] = {
            "wall_s": wall_s,
            "stages": stages,
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
        result["predicted_speedup"] = self._predict(result, commands, rounds, num_stages, wall)
        kind, reason = self._classify(result, busy_frac, commands)
        result["bottleneck"] = kind
        result["bottleneck_reason"] = reason
        return dict(sorted(result.items()))

    def _predict(
        self, result: dict[str, Any], commands: list[tuple], rounds: list[tuple], k: int, wall: int
    ) -> dict[str, Any]:
        """Speed of other layouts relative to this one from the overlap bound.

        Per round of all envs: env latency ``e`` (a stage's step round, independent of how
        many envs the stage has, i.e. enough cores for all workers) and caller time ``p``
        (all it does outside waits, or the time some inference span ran if longer, as
        with inference on actor threads; split evenly over stages). K stages cost
        ``max(p, e + p / K)`` per round (K = 1: the serial ``e + p``); decoupled mode
        ``max(p, e)``.
        """
        steps = [r for r in commands if r[1] == "step"]
        if rounds:
            e = float(np.mean([t1 - t0 for _, t0, t1, _ in rounds]))
            full_rounds = len(rounds) / k
        elif steps:
            e = float(np.mean([r[5] - r[2] for r in steps]))
            full_rounds = len(steps) / max(len(self._workers), 1)
        else:
            return {
                "stages": {},
                "decoupled": None,
                "env_s": None,
                "policy_s": None,
                "current_stages": k,
            }
        caller = max(wall - result["caller_wait_s"] * 1e9, self._inference_union() * wall)
        p = max(0.0, caller) / max(full_rounds, 1e-9)

        def cost(stages: int | None) -> float:
            return max(p, e) if stages is None else max(p, e + p / stages)

        here = cost(k)
        counts = sorted({1, 2, 4, k})
        return {
            "stages": {str(n): here / cost(n) for n in counts if n <= self.num_envs},
            "decoupled": here / cost(None),
            "env_s": e / 1e9,
            "policy_s": p / 1e9,
            "current_stages": k,
        }

    @property
    def num_envs(self) -> int:
        """Envs of the registered workers."""
        return sum(len(envs) for _, envs in self._workers.values()) or 1

    def _classify(
        self, result: dict[str, Any], busy_frac: dict[int, float], commands: list[tuple]
    ) -> tuple[str, str]:
        wall = result["wall_s"]
        if not commands:
            return (
                "policy",
                "no worker commands were recorded: the caller never waited on the envs.",
            )
        waiting = 1.0 - result["caller_busy_fraction"]
        inference = 1.0 - result["policy_idle_fraction"]
        # the policy's share: the caller's busy time, or (inference on actor threads, as
        # in an InferenceChannel whose driver mostly waits) the time some inference ran
        busy = max(result["caller_busy_fraction"], self._inference_union())
        env_busy = float(np.mean(list(busy_frac.values()))) if busy_frac else 0.0
        occupied = self._occupancy()
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
                "; the caller and the envs take about as long, so overlapping them (more "
                f"stages, or decoupled mode) can gain up to {gain:.2f}x"
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

    def _inference_union(self) -> float:
        """Share of wall time during which some thread ran an ``"inference"`` span."""
        spans = sorted((s[3], s[4]) for s in self._spans if s[0] == "inference")
        return min(1.0, _union(spans) / max(self._wall_ns(), 1))

    def _occupancy(self) -> float:
        """Mean over workers of the share of wall time with a command in flight."""
        per = max(self._wall_ns(), 1)
        by_worker: dict[int, list[tuple[int, int]]] = {}
        for r in self._commands:
            by_worker.setdefault(r[0], []).append((r[2], r[5]))
        if not by_worker:
            return 0.0
        fractions = [min(1.0, _union(sorted(iv)) / per) for iv in by_worker.values()]
        return float(np.mean(fractions))

    # ------------------------------------------------------------------ exports

    def chrome_trace(self) -> dict[str, Any]:
        """The recording as a Chrome trace dict (what ``export_chrome_trace`` writes).

        Raises:
            ProfilingDisabledError: Profiling is off.
        """
        self._require("chrome_trace()")
        origin = self._extent()[0]

        def us(t: int) -> float:
            return (t - origin) / 1e3

        caller, stages_pid, workers_pid = 1, 2, 3
        events: list[dict[str, Any]] = [
            _meta("process_name", caller, 0, name="caller"),
            _meta("process_name", stages_pid, 0, name="stages"),
            _meta("process_name", workers_pid, 0, name="workers"),
        ]
        for pid in (caller, stages_pid, workers_pid):
            events.append(_meta("process_sort_index", pid, 0, sort_index=pid))
        threads = sorted(self._threads.values()) or [(0, threading.main_thread().name)]
        if not any(t == 0 for t, _ in threads):
            threads.insert(0, (0, "caller"))
        for tid, name in threads:
            events.append(_meta("thread_name", caller, tid, name=f"caller ({name})"))
        for s in range(max(self.num_stages, 1)):
            events.append(_meta("thread_name", stages_pid, s, name=f"stage {s}"))
            events.append(_meta("thread_sort_index", stages_pid, s, sort_index=s))
        for w, (s, envs) in sorted(self._workers.items()):
            label = f"worker {w} (stage {s}, envs {envs[0]}-{envs[-1]})" if envs else f"worker {w}"
            events.append(_meta("thread_name", workers_pid, w, name=label))
            events.append(_meta("thread_sort_index", workers_pid, w, sort_index=w))
        tid0 = threads[0][0]
        for name, stage, tid, t0, t1 in self._spans:
            events.append(
                _complete(name, "span", caller, tid, us(t0), (t1 - t0) / 1e3, stage=stage)
            )
        for name, stages, t0, t1 in merged_waits(self._waits):
            label = name + "".join(f" stage {s}" for s in stages)
            events.append(
                _complete(label, "wait", caller, tid0, us(t0), (t1 - t0) / 1e3, stages=list(stages))
            )
        for stage, op, t0, t1 in self._stage_spans:
            events.append(_complete(op, "stage", stages_pid, stage, us(t0), (t1 - t0) / 1e3))
        for worker, command, t_sent, t_start, t_end, t_recv, kind in self._commands:
            rtt = (t_recv - t_sent) / 1e3
            args: dict[str, Any] = {"round_trip_us": rtt, "answer": kind}
            if t_start is None or t_end is None:
                events.append(
                    _complete(command, "command", workers_pid, worker, us(t_sent), rtt, **args)
                )
                continue
            start, dur = _placed(t_sent, t_start, t_end, t_recv)
            if start != t_start:
                args["clock"] = "shifted"
            args["sent_to_start_us"] = (start - t_sent) / 1e3
            args["end_to_received_us"] = (t_recv - start - dur) / 1e3
            events.append(
                _complete(command, "command", workers_pid, worker, us(start), dur / 1e3, **args)
            )
        for name, worker, t, args in self._instants:
            events.append(
                {
                    "name": name,
                    "cat": "event",
                    "ph": "i",
                    "s": "t",
                    "pid": workers_pid,
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

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write the recording as a Chrome trace (JSON) that Perfetto UI
        (ui.perfetto.dev) and chrome://tracing open.

        The file holds ``{"traceEvents": [...]}``: complete events (``"ph": "X"``, ``ts`` and
        ``dur`` in microseconds from the first event) on one track per worker (its
        commands as the worker ran them; the round trip in ``args``), per stage (calls in
        flight) and for the caller (spans and waits, one track per thread), with
        process/thread name metadata; restarts, deadline kills and deaths as instant
        events on the worker's track.

        Args:
            path: Output file.

        Returns:
            The path written.

        Raises:
            ProfilingDisabledError: Profiling is off.
        """
        self._require("export_chrome_trace()")
        path = Path(path)
        path.write_text(json.dumps(self.chrome_trace()))
        return path

    def plot(
        self, path: str | Path, start_s: float | None = None, duration_s: float | None = None
    ) -> Path:
        """Draw a timeline PNG: one row per caller thread, stage and worker, coloured by
        what each was doing (needs matplotlib).

        Args:
            path: Output PNG.
            start_s: Window start in seconds from the first event; default: a window
                ending at the last event.
            duration_s: Window length; default: the last 24 commands of the busiest
                worker (the whole recording if shorter).

        Returns:
            The path written.

        Raises:
            ProfilingDisabledError: Profiling is off.
            ImportError: matplotlib is missing (``pip install matplotlib``).
        """
        self._require("plot()")
        from ._timeline import draw_timeline

        return draw_timeline(self, Path(path), start_s, duration_s)

    # read-only views for the timeline drawer (tuples as recorded)

    def records(self) -> dict[str, list[tuple]]:
        """The raw recording: ``commands`` ``(worker, command, t_sent, t_start, t_end,
        t_received, answer_kind)``, ``stage_spans`` ``(stage, op, t0, t1)``, ``waits``
        ``(name, stage, t0, t1)``, ``spans`` ``(name, stage, thread_track, t0, t1)``,
        ``instants`` ``(name, worker, t, args)``; times are ``time.monotonic_ns`` values.

        Raises:
            ProfilingDisabledError: Profiling is off.
        """
        self._require("records()")
        return {
            "commands": list(self._commands),
            "stage_spans": list(self._stage_spans),
            "waits": list(self._waits),
            "spans": list(self._spans),
            "instants": list(self._instants),
        }

    def layout(self) -> tuple[dict[int, tuple[int, tuple[int, ...]]], dict[int, str]]:
        """``({worker: (stage, env_indices)}, {thread_track: thread_name})``."""
        return dict(self._workers), {t: n for t, n in self._threads.values()}

    def __repr__(self) -> str:
        state = "off" if not self.enabled else ("recording" if self.recording else "paused")
        return f"Profiler({state}, {len(self._commands)} commands, {len(self._spans)} spans)"


def merged_waits(waits: Sequence[tuple]) -> list[tuple[str, tuple[int, ...], int, int]]:
    """Caller waits ``(name, stage, t0, t1)`` merged where they overlap (a whole-env call
    waits for every stage at once): ``(name, stages, t0, t1)``, in time order."""
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


def _union(intervals: list[tuple[int, int]]) -> int:
    """Total length covered by sorted ``(start, end)`` intervals."""
    total, start, end = 0, None, None
    for a, b in intervals:
        if end is None or a > end:
            if end is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    return total + (end - start if end is not None else 0)


def _finished(record: tuple) -> int:
    """When the worker finished the command on the caller's clock (received if unknown)."""
    if record[4] is None:
        return record[5]
    start, dur = _placed(record[2], record[3], record[4], record[5])
    return start + dur


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
        start, dur = _placed(r[2], r[3], r[4], r[5])
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


def _busy(record: tuple) -> int:
    """Time inside the worker (the round trip when the answer carried no worker times)."""
    if record[3] is None:
        return record[5] - record[2]
    return record[4] - record[3]


def _straggle(durations: list[int]) -> float:
    top = max(durations)
    return 0.0 if top <= 0 else 1.0 - float(np.mean(durations)) / top


def _placed(t_sent: int, t_start: int, t_end: int, t_recv: int) -> tuple[int, int]:
    """Where to draw a worker span: as measured if inside the round trip, else its
    duration centred in the round trip (a clock that is not the caller's)."""
    dur = max(0, t_end - t_start)
    if t_sent <= t_start and t_end <= t_recv:
        return t_start, dur
    dur = min(dur, t_recv - t_sent)
    return t_sent + (t_recv - t_sent - dur) // 2, dur


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


def placed(t_sent: int, t_start: int | None, t_end: int | None, t_recv: int) -> tuple[int, int]:
    """Start and duration (ns) to draw a command at (see the module doc on clocks)."""
    if t_start is None or t_end is None:
        return t_sent, t_recv - t_sent
    return _placed(t_sent, t_start, t_end, t_recv)
