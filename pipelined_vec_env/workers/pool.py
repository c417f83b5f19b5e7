"""`WorkerPool`: the workers of one vector env, their commands in flight and their failures.

The pool is the one place that starts, restarts, rebuilds and stops workers. It keeps
each worker's queue of commands in flight (`InFlight`: the command, its envs, when it was
sent) and one `WorkerPool.poll` that returns the answers completed since, applying on one
clock (each command's own send time) crash detection (the backend's wait, see
`transport.WorkerBackend`) and the ``step_deadline`` kill of a worker whose
``step``/``reset`` overran. Stage stepping (`stage_stepping.py`) sends
through it and waits until its workers' queues are empty (`WorkerPool.wait`); the restart
policy (`WorkerPool.rebuild`: fresh processes and a reset of all their envs, the failed
workers of a call together, retried within ``max_restarts``) and the rebuild of dead
workers before a reset (`WorkerPool.revive_dead`) live here too. What a restart means to
the caller (a truncated step) is the stepping mode's business, not the pool's.

The wire of one worker is its handle, through the small `transport.WorkerTransport`
interface (`worker_handle.WorkerHandle`: a pipe, with steps through a shared-memory slot
on the fast path, see docs/wire_format.md; or `ray_backend.RayWorkerHandle`: actor
calls), and the waits on several workers are the backend's (`transport.WorkerBackend`:
`worker_handle.ProcessBackend` or `ray_backend.RayBackend`), picked once in
`WorkerPool.spawn`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from ..by_value import ByValue
from ..errors import WaitTimeoutError, WorkerCrashedError, describe_exit
from ..stacks import innermost_frames
from .failures import raise_worker_error
from .protocol import NO_ANSWER, Answer, Command, Crashed, Raised, Ready, TimedOut
from .render_devices import RenderDeviceEnvFn
from .spinning import TAIL_SPIN_SECONDS, SpinGate, can_spin
from .transport import WorkerBackend, WorkerTransport
from .waiting import deadline_after, poll_fds, remaining
from .worker import NicedEnvFn
from .worker_handle import ProcessBackend, WorkerHandle

__all__ = ["InFlight", "WorkerPool", "resolve_affinity"]

logger = logging.getLogger(__name__)

#: Commands ``step_deadline`` applies to (``start_timeout`` applies to `Command.START`).
_DEADLINE_COMMANDS = frozenset({Command.STEP, Command.STEP_ENV, Command.RESET})


@dataclass(slots=True)
class InFlight:
    """One command sent to a worker and not answered yet.

    Attributes:
        command: What was sent.
        env_ids: The global ids of the envs it is for.
        sent_at: When the worker could start it (``time.monotonic()``): its send, or the
            answer to the command queued before it, whichever is later;
            ``step_deadline`` counts from it.
    """

    command: Command
    env_ids: tuple[int, ...]
    sent_at: float


def resolve_affinity(
    cpu_affinity: str | Sequence[Sequence[int]] | None, num_workers: int
) -> list[tuple[int, ...] | None]:
    """One core set per worker (or None) for ``cpu_affinity`` (see `PipelinedVectorEnv`).

    Raises:
        ValueError: Not None, ``"auto"`` or one non-empty set of core ids per worker.
    """
    if cpu_affinity is None:
        return [None] * num_workers
    if cpu_affinity == "auto":
        if not hasattr(os, "sched_getaffinity"):
            logger.warning("cpu_affinity='auto' is ignored: os.sched_getaffinity is Linux-only")
            return [None] * num_workers
        cores = sorted(os.sched_getaffinity(0))
        return [(cores[i % len(cores)],) for i in range(num_workers)]
    if isinstance(cpu_affinity, str) or len(cpu_affinity) != num_workers:
        raise ValueError(
            f"cpu_affinity: expected None, 'auto' or one core set per worker "
            f"({num_workers} workers), got {cpu_affinity!r}"
        )
    sets = []
    for i, cores in enumerate(cpu_affinity):
        cores = tuple(int(c) for c in cores)
        if not cores or any(c < 0 for c in cores):
            raise ValueError(
                f"cpu_affinity[{i}]: expected a non-empty set of core ids, got {cores}"
            )
        sets.append(cores)
    return sets


def _preload_worker_module(ctx: Any) -> None:
    """Have the fork server import our worker module (numpy, gymnasium ...) once, so each
    worker forked from it starts in about 0.1 s instead of re-importing them (~1 s).

    Only takes effect if the fork server has not started yet; user preloads are kept.
    """
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    preload = list(getattr(forkserver._forkserver, "_preload_modules", []))
    if "pipelined_vec_env.workers.worker" not in preload:
        ctx.set_forkserver_preload([*preload, "pipelined_vec_env.workers.worker"])


def _default_context() -> str:
    return "forkserver" if sys.platform.startswith("linux") else "spawn"


def _ray_backend(
    ray_options: Any, num_workers: int, autoreset_mode: Any, worker_threads: int | None
) -> tuple[WorkerBackend, Callable[[int, int, tuple[int, ...], bytes], Any]]:
    """The Ray backend and a constructor of its worker handles (imports ray only here)."""
    try:
        from .ray_backend import RayBackend, RayOptions, RayWorkerHandle, ensure_ray
    except ImportError as exc:
        raise ImportError("backend='ray' needs Ray: pip install 'pipelined-vec-env[ray]'") from exc
    options = RayOptions.from_value(ray_options)
    ensure_ray(options, num_workers)

    def make(index: int, stage: int, env_indices: tuple[int, ...], fns: bytes) -> Any:
        return RayWorkerHandle(
            index, stage, env_indices, fns, autoreset_mode, worker_threads, options
        )

    return RayBackend(), make


class WorkerPool:
    """The workers of one vector env: start, commands in flight, failures, restarts, stop.

    Args:
        start_timeout: Seconds each worker may take to start and build its envs (at
            start-up and at every rebuild).
        step_deadline: Seconds a worker may take to answer a ``step``/``reset``, counted
            from its send; None: no deadline.
        max_restarts: Rebuilds allowed per worker by `rebuild`.
        profiler: The vector env's `Profiler` when profiling is on, else None.

    Attributes:
        handles: The workers, in global order (stages, then workers within a stage).
        backend: Their backend's waits on several workers (`transport.WorkerBackend`).
        context: The ``multiprocessing`` context (None with Ray).
        workers_spin: Whether the workers spin for their next step, yielding their cores
            (`WorkerHandle.worker_spin`): each can have a core of its own. The caller's
            `wait` then spins too, yielding its core, for the last answers of a call once
            the first came (`TAIL_SPIN_SECONDS`).
    """

    def __init__(
        self,
        *,
        start_timeout: float,
        step_deadline: float | None,
        max_restarts: int,
        profiler: Any = None,
    ) -> None:
        self.start_timeout = start_timeout
        self.step_deadline = step_deadline
        self.max_restarts = max_restarts
        self.profiler = profiler
        self.workers_spin = False
        # the caller's spun waits for a call's last answers (`wait`)
        self._tail = SpinGate(TAIL_SPIN_SECONDS)
        self.handles: list[WorkerTransport] = []
        self.backend: WorkerBackend = ProcessBackend()
        self.context: Any = None
        self._queues: dict[int, deque[InFlight]] = {}
        self._answers: dict[int, deque[Answer]] = {}
        self._attach: tuple[Any, Any, int, tuple[Any, ...]] | None = None

    # ------------------------------------------------------------------ start

    def spawn(
        self,
        layout: Sequence[tuple[int, Sequence[tuple[int, int]]]],
        env_fns: Sequence[Callable[[], Any]],
        *,
        backend: str,
        context: Any,
        cpu_affinity: Any,
        worker_threads: int | None,
        daemon: bool,
        autoreset_mode: Any,
        ray_options: Any,
        fast_path: bool = True,
        worker_nice: int | str | None = None,
        render_devices: tuple[int, ...] | None = None,
    ) -> None:
        """Start one worker per env range of ``layout`` (``(stage, [(lo, hi), ...])``), in
        parallel; `start` then waits for them. Started workers are in `handles` at once,
        so `close` stops them if a later one fails to start. With ``worker_nice`` each
        worker sets that nice value before building its envs (`worker.NicedEnvFn` around
        its first constructor, so restarts apply it again); with ``render_devices``
        worker ``i`` renders on CUDA device ``render_devices[i % len(render_devices)]``
        (`render_devices.RenderDeviceEnvFn`, the same way, mapped to its EGL index).

        Subprocess workers step through shared-memory slots with ``fast_path``
        (`worker_handle.WorkerHandle`); the caller's waits spin only when every worker
        and the caller can have a core of their own, the workers' (yielding their cores)
        when every worker can (`spinning.can_spin`).

        Raises:
            ValueError: Bad ``cpu_affinity`` or Ray resources (before any worker starts).
        """
        num_workers = sum(len(ranges) for _, ranges in layout)
        cores = resolve_affinity(cpu_affinity, num_workers)
        if backend == "ray":
            self.backend, make = _ray_backend(
                ray_options, num_workers, autoreset_mode, worker_threads
            )
        else:
            ctx = (
                context
                if hasattr(context, "Process")
                else mp.get_context(context or _default_context())
            )
            self.context = ctx
            _preload_worker_module(ctx)
            spin = num_workers + 1 if fast_path and can_spin(num_workers + 1) else 0
            # the workers alone: the caller takes a spinning worker's core when it needs it
            worker_spin = self.workers_spin = fast_path and can_spin(num_workers)

            def make(index: int, stage: int, env_indices: tuple[int, ...], fns: bytes) -> Any:
                return WorkerHandle(
                    ctx,
                    index=index,
                    stage=stage,
                    env_indices=env_indices,
                    pickled_env_fns=fns,
                    autoreset_mode=autoreset_mode,
                    cpu_cores=cores[index],
                    worker_threads=worker_threads,
                    daemon=daemon,
                    fast_path=fast_path,
                    spin=spin,
                    worker_spin=worker_spin,
                )

        for s, ranges in layout:
            for lo, hi in ranges:
                index = len(self.handles)
                fns = list(env_fns[lo:hi])
                if render_devices:
                    device = render_devices[index % len(render_devices)]
                    fns[0] = RenderDeviceEnvFn(fns[0], device)
                if worker_nice is not None:
                    fns[0] = NicedEnvFn(fns[0], worker_nice)
                pickled = cloudpickle.dumps([ByValue(fn) for fn in fns])  # envs share nothing
                handle = make(index, s, tuple(range(lo, hi)), pickled)
                self.handles.append(handle)
                self._queues[index] = deque()
                if self.profiler is not None:
                    self.profiler.add_worker(handle.index, handle.stage, handle.env_indices)
                    handle.profiler = self.profiler

    def start(self) -> list[dict[str, Any]]:
        """Wait for every worker's start-up (each at most ``start_timeout``).

        Returns:
            Each worker's `Ready` description, in worker order.

        Raises:
            WaitTimeoutError / the constructor's exception / WorkerCrashedError: The first
                worker that failed to start (the others are not waited for).
        """
        answers = self._wait_started(self.handles)
        for h in self.handles:  # the first failure, without waiting for the others
            answer = answers.get(h.index)
            if answer is not None and not isinstance(answer, Ready):
                raise_worker_error(h, answer)
        return [answers[h.index].description for h in self.handles]

    def _wait_started(self, workers: Sequence[Any], every: bool = False) -> dict[int, Answer]:
        """Wait for the start-up answers of freshly started ``workers``, each at most
        ``start_timeout`` from its own start (process start or Ray actor creation, env
        construction, the `Ready` answer); a worker past it is killed and answers
        `TimedOut`. Returns once every worker answered, or (unless ``every``) as soon as
        one failed (the caller then stops them all). Returns the answers received, by
        worker index."""
        now = time.monotonic()
        for w in workers:
            w.deadline_exceeded = False
            self._queues[w.index].append(InFlight(Command.START, w.env_indices, now))
        answers: dict[int, Answer] = {}
        while not self.idle(workers):
            for w, _ in self.poll(workers, None):
                answer = self.take(w)
                assert answer is not None
                if w.deadline_exceeded and isinstance(answer, Crashed):
                    answer = TimedOut(
                        f"worker {w.index} (envs {list(w.env_indices)}) did not build its envs "
                        f"and answer within start_timeout={self.start_timeout:g} s; it was killed"
                        + _frames_text(w.stacks)
                    )
                    w.deadline_exceeded = False
                answers[w.index] = answer
            if not every and any(not a.ok for a in answers.values()):
                break
        return answers

    def attach(self, space: Any, buffers: Any, num_envs: int, generations: Sequence = ()) -> None:
        """Tell every worker (and every rebuilt one) where observations go: ``buffers``
        (None: the pipe), or the ``generations`` a step names (`observation_ring`)."""
        self._attach = (space, buffers, num_envs, tuple(generations))
        for h in self.handles:
            self.send(h, Command.ATTACH, self._attach)

    def worker_of(self, g: int) -> Any:
        """The worker holding env ``g``."""
        for w in self.handles:
            if w.env_indices[0] <= g <= w.env_indices[-1]:
                return w
        raise AssertionError(g)

    # ------------------------------------------------------------------ commands

    def send(self, w: Any, command: Command, payload: Any, env_ids: Sequence[int] = ()) -> None:
        """Send ``command`` to worker ``w``; its answer is queued for `poll`.

        A worker found dead while sending answers `Crashed` at the next `poll` (so every
        worker of a call stays in step with the protocol).
        """
        if command in NO_ANSWER:
            w.send(command, payload, expect_answer=False)
            return
        self._queues[w.index].append(InFlight(command, tuple(env_ids), time.monotonic()))
        w.send(command, payload)

    def in_flight(self, w: Any) -> tuple[InFlight, ...]:
        """Worker ``w``'s commands in flight, oldest first."""
        return tuple(self._queues[w.index])

    def idle(self, workers: Sequence[Any]) -> bool:
        """Whether none of ``workers`` has a command in flight."""
        return not any(self._queues[w.index] for w in workers)

    def poll(self, workers: Sequence[Any], timeout: float | None) -> list[tuple[Any, InFlight]]:
        """Collect the answers of ``workers`` that complete within ``timeout`` seconds.

        Returns at once when some answer is already there; otherwise waits until one
        arrives, a worker is found dead (`Crashed`), a ``step_deadline`` overrun kills a
        worker (its crash is read by the next call), or ``timeout`` passes; then `take` them.

        Returns:
            ``(worker, command)`` for each command completed by this call (maybe none).
        """
        return self.poll_or_wake(workers, timeout, None)[0]

    def poll_written(self, workers: Sequence[Any]) -> list[tuple[Any, InFlight]]:
        """`poll` with no wait, skipping the system call where `WorkerBackend.none_written`
        says no answer came (a worker's death is then left to the next wait)."""
        busy = self.busy(workers)
        none = not busy or self.backend.none_written(busy)
        return [] if none else self._collect(busy, 0.0, None)[0]

    def poll_or_wake(
        self, workers: Sequence[Any], timeout: float | None, wake_fd: int | None
    ) -> tuple[list[tuple[Any, InFlight]], bool]:
        """`poll`, that also returns when the descriptor ``wake_fd`` (not read) turns
        readable, even with no worker busy (the inference channel's wait on its actors
        and the envs together).

        Returns:
            ``(completed, woken)``: as `poll` returns, and whether ``wake_fd`` was
            readable (always False for None).
        """
        busy = self.busy(workers)
        if not busy:
            if wake_fd is None:
                return [], False
            return [], bool(poll_fds([wake_fd], timeout))
        return self._collect(busy, timeout, wake_fd)

    def _collect(
        self, busy: list[Any], timeout: float | None, wake_fd: int | None
    ) -> tuple[list[tuple[Any, InFlight]], bool]:
        """`poll_or_wake` on ``busy`` (each with a command in flight)."""
        woken = False
        for w in busy:
            if w.answer is not None or (w.dead and not w.pending):
                # an answer (or a crash) is here already: do not block
                if wake_fd is not None:
                    woken = bool(poll_fds([wake_fd], 0))
                break
        else:
            woken = self.backend.receive_ready(busy, self.enforce_deadlines(busy, timeout), wake_fd)
        done = []
        for w in busy:
            if w.answer is None and w.dead and not w.pending:
                answer: Answer = Crashed(w.exitcode)  # a command sent after its death
            elif w.answer is not None:
                answer = w.take()
            else:
                continue
            answers = self._answers.get(w.index)
            if answers is None:
                answers = self._answers[w.index] = deque()
            answers.append(answer)
            done.append((w, self.finish(w)))
        return done, woken

    def busy(self, workers: Sequence[Any]) -> list[Any]:
        """Those of ``workers`` with commands in flight."""
        return [w for w in workers if self._queues[w.index]]

    def drop(self, w: Any) -> list[InFlight]:
        """Forget worker ``w``'s commands in flight and unread answers (its process is
        gone, or about to be replaced); return the commands, oldest first."""
        lost = list(self._queues[w.index])
        self._queues[w.index].clear()
        self._answers.pop(w.index, None)
        return lost

    def _limit(self, command: Command) -> tuple[float | None, str]:
        """The seconds ``command`` may take to be answered, and the setting's name."""
        if command in _DEADLINE_COMMANDS:
            return self.step_deadline, "step_deadline"
        if command == Command.START:
            return self.start_timeout, "start_timeout"
        return None, ""

    def enforce_deadlines(self, workers: Sequence[Any], timeout: float | None) -> float | None:
        """Kill those of ``workers`` (each with a command in flight) whose oldest command
        overran its limit (``start_timeout``, ``step_deadline``); return how long to wait
        now for them: ``timeout`` or until the next overrun, whichever comes first (0
        after a kill: the killed worker's crash is read next)."""
        now = time.monotonic()
        wait = timeout
        for w in workers:  # busy: each has a command in flight
            head = self._queues[w.index][0]
            limit, name = self._limit(head.command)
            if limit is None or w.deadline_exceeded:
                continue
            due = head.sent_at + limit
            if now >= due:
                logger.warning("worker %d overran %s=%.3g s; killing it", w.index, name, limit)
                w.kill_for_deadline()
                return 0.0  # its sentinel turns readable: read the crash
            wait = due - now if wait is None else min(wait, due - now)
        return wait

    def wait(
        self,
        workers: Sequence[Any],
        timeout: float | None,
        on_answer: Callable[[Any, Answer], None] | None = None,
    ) -> None:
        """Poll until none of ``workers`` has a command in flight.

        ``on_answer(worker, answer)``, where given, is called for each answer as it is
        collected, while the other workers still step (a step's observations are copied
        there, worker by worker); the answer stays queued for `take`.

        Answers received before a timeout stay in the pool, so a later wait picks up
        where this one stopped.

        Where the workers spin (`workers_spin`), the wait for the answers still missing
        once some came spins first, yielding the core at each look, for at most
        `TAIL_SPIN_SECONDS` while such spins have found them in time (a `SpinGate`): the
        answers of a call come close together, and a caller asleep in the kernel then
        pays a wake-up for the last one (tens of microseconds on a VM). A spin that
        misses falls back to the bounded poll, which notices a dead worker.

        Raises:
            WaitTimeoutError: Some answers did not arrive within ``timeout`` seconds.
        """
        deadline = deadline_after(timeout)
        queues = self._queues
        busy = [w for w in workers if queues[w.index]]
        tail = False  # some answers of this call came: spin for the rest
        while busy:
            spun = tail and self.workers_spin and self._tail.allows()
            if spun:
                started = time.perf_counter()
                budget = TAIL_SPIN_SECONDS
                if deadline is not None:  # never past the caller's timeout
                    budget = min(budget, remaining(deadline) or 0.0)
                self.backend.spin_for_answers(busy, budget)
            done = self._collect(busy, remaining(deadline), None)[0]
            if on_answer is not None:
                for w, _ in done:
                    on_answer(w, self._answers[w.index][-1])
            if spun:
                self._tail.record(time.perf_counter() - started)
            left = [w for w in busy if queues[w.index]]
            tail = len(left) < len(busy)
            busy = left
            if busy and deadline is not None and remaining(deadline) == 0:
                waiting = [w.index for w in busy]
                raise WaitTimeoutError(
                    f"worker(s) {waiting} did not answer within {timeout} s; the call stays "
                    "in flight and a later wait returns its result"
                )

    def finish(self, w: Any) -> InFlight:
        """Forget the command of worker ``w`` whose answer the caller just took from its
        handle, and return it: the oldest, but for a `Command.STEP_ENV`'s (`_answered`).
        The command queued next runs from now, unless a `Command.STEP_ENV` (started as
        it came)."""
        queue = self._queues[w.index]
        k = _answered(queue, getattr(w, "answer_tag", None), w.env_indices)
        command = queue[k]
        del queue[k]
        if queue and queue[0].command != Command.STEP_ENV:
            if queue[0].sent_at < (now := time.monotonic()):
                queue[0].sent_at = now
        return command

    def take(self, w: Any) -> Answer | None:
        """Return and forget worker ``w``'s oldest completed answer (None: it has none)."""
        answers = self._answers.get(w.index)
        return answers.popleft() if answers else None

    # ------------------------------------------------------------------ failures

    def find_dead(self, workers: Sequence[Any]) -> None:
        """Mark dead those of ``workers`` that died while idle (nothing waited on them)."""
        self.backend.find_dead(workers)

    def start_fresh(self, workers: Sequence[Any], counted: bool) -> dict[int, Answer | None]:
        """Replace the processes of ``workers`` with fresh ones (their commands in flight
        are lost): every one is started before any is waited for, so their start-ups
        (env construction: seconds for a LIBERO env) overlap. Wait for them together (each
        at most ``start_timeout``) and attach those that started to the observations.

        Args:
            counted: Count each in ``w.restarts`` (the ``max_restarts`` budget).

        Returns:
            Per worker index, its failure answer, or None where it started.
        """
        for w in workers:
            self._queues[w.index].clear()
            self._answers.pop(w.index, None)
            w.restart(counted=counted)
        started = self._wait_started(workers, every=True)
        failures: dict[int, Answer | None] = {}
        for w in workers:
            ready = started[w.index]
            if isinstance(ready, Ready):
                if self._attach is not None:
                    self.send(w, Command.ATTACH, self._attach)
                failures[w.index] = None
            else:
                failures[w.index] = ready
        return failures

    def rebuild(self, failures: Sequence[tuple[Any, Answer, str]]) -> dict[int, Answer]:
        """Rebuild the workers of ``failures`` (``(worker, its failure answer, the
        op that failed)``): fresh processes and a reset of all their envs, again while
        that fails and ``max_restarts`` allows (each try counts). All of them restart
        together (`start_fresh`) and reset together, so several workers that failed in
        one call are back after one start-up, not one after another.

        Each start is bounded by ``start_timeout`` and each reset by ``step_deadline``,
        so a rebuild never hangs.

        Returns:
            Per worker index, the reset's `Ok` (``(items, infos)``, every env's info marked
            ``worker_restarted``) or the last failure.
        """
        done: dict[int, Answer] = {}
        pending = list(failures)
        while pending:
            for w, failure, op in pending:
                _log_restart(w, failure, op, self.step_deadline, self.max_restarts)
            workers = [w for w, _, _ in pending]
            failed = self.start_fresh(workers, counted=True)
            started = [w for w in workers if failed[w.index] is None]
            for w in started:
                resets = [(k, None, None) for k in range(len(w.env_indices))]
                self.send(w, Command.RESET, resets, w.env_indices)
            self.wait(started, None)
            retry = []
            for w in workers:
                answer = failed[w.index]
                if answer is None:
                    answer = self.take(w)
                assert answer is not None
                if answer.ok:
                    _, reset_infos = answer.payload
                    for k in range(len(w.env_indices)):
                        reset_infos[k] = [{**reset_infos[k][0], "worker_restarted": True}]
                    done[w.index] = answer
                elif w.restarts >= self.max_restarts:
                    done[w.index] = answer
                else:
                    retry.append((w, answer, "rebuild"))
            pending = retry
        return done

    def revive_dead(self, workers: Sequence[Any], reset_envs: set[int]) -> None:
        """Rebuild those of ``workers`` found dead, before a reset of ``reset_envs``.

        A reset starts every episode over, so a fresh process can take the dead one's
        place; such a rebuild does not count against ``max_restarts``. It needs the reset
        to cover all the worker's envs (checked for every dead worker before any is
        rebuilt). A worker that died while idle (nothing noticed it yet) is found here
        too, so the reset does not fail on it. The dead workers restart together
        (`start_fresh`).

        Raises:
            WorkerCrashedError: The reset leaves out some of a dead worker's envs.
            The env's exception / WorkerCrashedError: A rebuilt worker failed to start
                (the first, in worker order).
        """
        self.find_dead(workers)
        dead = [w for w in workers if w.dead]
        for w in dead:
            if not set(w.env_indices) <= reset_envs:
                raise WorkerCrashedError(
                    w.index,
                    w.env_indices,
                    w.exitcode,
                    "a dead worker is rebuilt only by a reset that includes all its envs",
                )
        for w in dead:
            logger.warning(
                "rebuilding dead worker %d (envs %s, exit code %s) for the reset",
                w.index,
                list(w.env_indices),
                w.exitcode,
            )
        if not dead:
            return
        failed = self.start_fresh(dead, counted=False)
        for w in dead:
            answer = failed[w.index]
            if answer is not None:
                raise_worker_error(w, answer)

    # ------------------------------------------------------------------ stop

    def close(self, timeout: float) -> None:
        """Stop every worker in parallel (``timeout`` seconds in all for the polite part,
        0: terminate at once). Always returns."""
        try:
            self.backend.close_all(self.handles, timeout)
        except Exception:  # close must always return
            logger.warning("closing the workers failed", exc_info=True)
            for h in self.handles:
                with contextlib.suppress(Exception):
                    h.close(timeout=0.0)
        for queue in self._queues.values():
            queue.clear()
        self._answers.clear()


def _answered(queue: deque[InFlight], tag: int | None, env_indices: tuple[int, ...]) -> int:
    """The position in ``queue`` (a worker's commands in flight) of the command that its
    answer tagged ``tag`` answers: the `Command.STEP_ENV` of env ``tag`` (local index;
    such answers come as each env is done), or for an untagged answer the oldest other
    command (the worker serves those in order, after the env steps read before them);
    0 where none matches (a crash answers the oldest)."""
    if tag is None and queue and queue[0].command != Command.STEP_ENV:
        return 0  # the common case: answers in order
    if tag is not None:
        g = env_indices[tag]
        for k, c in enumerate(queue):
            if c.command == Command.STEP_ENV and c.env_ids[0] == g:
                return k
        return 0
    for k, c in enumerate(queue):
        if c.command != Command.STEP_ENV:
            return k
    return 0


def _log_restart(
    w: Any, failure: Answer, op: str, step_deadline: float | None, max_restarts: int
) -> None:
    """Log why worker ``w`` restarts (``failure``, the answer to its ``op``)."""
    if w.deadline_exceeded:
        why = f"step_deadline={step_deadline} s exceeded" + _frames_text(w.stacks)
    elif isinstance(failure, Raised):
        why = f"{failure.type_name}: {failure.message}"
    elif isinstance(failure, TimedOut):
        why = failure.message
    else:
        assert isinstance(failure, Crashed), failure
        why = describe_exit(failure.exitcode)
    logger.warning(
        "restarting worker %d (envs %s) after a failed %s (%s); restart %d of %d",
        w.index,
        list(w.env_indices),
        op,
        why,
        w.restarts + 1,
        max_restarts,
    )
    if isinstance(failure, Raised):
        logger.warning("worker %d traceback:\n%s", w.index, failure.traceback)


def _frames_text(stacks: str | None) -> str:
    """The innermost frames of a killed worker's ``stacks`` as the end of a message."""
    if not stacks:
        return ""
    return "\nInnermost frames of its threads before the kill:\n" + innermost_frames(stacks)
