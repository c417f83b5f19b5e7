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

This module records; each output has its own module and reads a `Recording` snapshot
(`profile_records`), never the profiler: `profile_summary` (where the time went, the
bottleneck, predicted speedups), `chrome_trace` (the trace JSON) and `_timeline` (the
PNG). The `Profiler` methods `summary()`, `chrome_trace()`, `export_chrome_trace()` and
`plot()` hand them `snapshot()`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .chrome_trace import build_trace, write_trace
from .records import Recording, busy_ns, finished_ns
from .summary import BOTTLENECKS, summarize
from .timeline import draw_timeline

__all__ = ["BOTTLENECKS", "Profiler", "ProfilingDisabledError"]

#: Commands without an answer: never recorded (nothing would close them).
_NO_ANSWER = frozenset({"attach", "set_autoreset", "close"})


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
            # per worker, its commands in flight: (command, sent, recorded, env or None)
            self._pending: dict[int, deque[tuple[str, int, bool, int | None]]] = {}
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

    def command_sent(self, worker: int, command: str, env: int | None = None) -> None:
        """Worker ``worker`` was just sent ``command`` (answered commands only matter);
        ``env``: the local env of a ``step_env``, whose answer names it."""
        if command in _NO_ANSWER:
            return
        entry = (command, _now(), self.recording, env)
        self._pending.setdefault(worker, deque()).append(entry)

    def answer_received(
        self, worker: int, kind: str, times: tuple[int, int] | None, env: int | None = None
    ) -> None:
        """The answer to ``worker``'s oldest command arrived, or with ``env``, to its
        ``step_env`` of that local env (answered as each env is done); an answer without
        ``env`` is to the oldest other command (its worker answers those in order).

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
        k = next((k for k, e in enumerate(queue) if e[3] == env), 0)
        command, t_sent, keep, _ = queue[k]
        del queue[k]
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
        self._pending[worker].append(("start", _now(), self.recording, None))

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
                durations.append(busy_ns(record))
                done = max(done, finished_ns(record))
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

    # ------------------------------------------------------------------ outputs

    def _require(self, what: str) -> None:
        if not self.enabled:
            raise ProfilingDisabledError(
                f"profiler.{what}: profiling is off; build the vector env with profile=True "
                "(PipelinedVectorEnv(..., profile=True) or make_vec(..., profile=True))"
            )

    def snapshot(self) -> Recording:
        """A copy of everything recorded so far, as the summary, trace and picture read it.

        Returns:
            A `Recording` (`pipelined_vec_env.profiling.records`): the records, the
            recording windows and the layout, taken now.

        Raises:
            ProfilingDisabledError: Profiling is off.
        """
        self._require("snapshot()")
        return self._snapshot()

    def _snapshot(self) -> Recording:
        return Recording(
            commands=tuple(self._commands),
            stage_spans=tuple(self._stage_spans),
            rounds=tuple(self._rounds),
            waits=tuple(self._waits),
            spans=tuple(self._spans),
            instants=tuple(self._instants),
            windows=tuple((start, end) for start, end in self._windows),
            workers=dict(self._workers),
            threads={t: n for t, n in self._threads.values()},
            num_stages=self.num_stages,
            taken_at=_now(),
        )

    def summary(self) -> dict[str, Any]:
        """Where the time went, per stage and per worker, and what limits the speed.

        Returns:
            A JSON-ready dict: `wall_s`, per-stage and per-worker shares of it, the
            `bottleneck` (one of `BOTTLENECKS`) with `bottleneck_reason`, a sentence
            saying why, and `predicted_speedup` of other layouts; every key is described
            in [`summarize`][pipelined_vec_env.profiling.summary.summarize].

        Raises:
            ProfilingDisabledError: Profiling is off.
        """
        self._require("summary()")
        return summarize(self._snapshot())

    @property
    def num_envs(self) -> int:
        """Envs of the registered workers."""
        return sum(len(envs) for _, envs in self._workers.values()) or 1

    def chrome_trace(self) -> dict[str, Any]:
        """The recording as a Chrome trace dict (what ``export_chrome_trace`` writes).

        Raises:
            ProfilingDisabledError: Profiling is off.
        """
        self._require("chrome_trace()")
        return build_trace(self._snapshot())

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write the recording as a Chrome trace (JSON) that Perfetto UI
        (ui.perfetto.dev) and chrome://tracing open.

        One track per worker (its commands as the worker ran them, the round trip in
        `args`), per stage (calls in flight) and per caller thread (spans and waits);
        restarts, deadline kills and deaths as instant events. The layout is described
        in [`chrome_trace`][pipelined_vec_env.profiling.chrome_trace].

        Args:
            path: Output file.

        Returns:
            The path written.

        Raises:
            ProfilingDisabledError: Profiling is off.
        """
        self._require("export_chrome_trace()")
        return write_trace(self._snapshot(), path)

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
        return draw_timeline(self._snapshot(), Path(path), start_s, duration_s)

    # read-only views (tuples as recorded)

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
