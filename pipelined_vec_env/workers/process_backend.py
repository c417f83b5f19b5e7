"""The multiprocessing backend's waits on many workers at once (`ProcessBackend`).

Every wait watches the workers' pipes *and* their process sentinels with one
``select.poll``, so a dead worker is noticed at once instead of blocking forever
(gymnasium's ``AsyncVectorEnv`` gives ``EOFError`` or hangs there); where the caller may
spin, a bounded spin on the workers' slots comes first. Closing stops every worker in
parallel within one timeout. The caller's side of one worker is
[`WorkerHandle`][pipelined_vec_env.workers.worker_handle.WorkerHandle].
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import time
import warnings
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from .protocol import Command, Raised, from_wire
from .spinning import SPIN_SECONDS, spin_until
from .waiting import deadline_after, poll_fds, remaining
from .worker import send

if TYPE_CHECKING:
    from .worker_handle import WorkerHandle

__all__ = ["ProcessBackend"]

logger = logging.getLogger(__name__)


class ProcessBackend:
    """The multiprocessing backend's waits on several workers at once (implements
    `transport.WorkerBackend`): pipes and process sentinels watched together with one
    ``select.poll``, so a dead worker is noticed at once."""

    @staticmethod
    def receive_ready(
        handles: Sequence[WorkerHandle], timeout: float | None, wake_fd: int | None = None
    ) -> bool:
        """Wait until at least one pending handle of ``handles`` has an answer or is found
        dead (or ``wake_fd`` is readable), at most ``timeout`` seconds; receive each.

        A handle holds one received answer at a time: one whose ``answer`` was not taken
        yet is not read again. Watches each pending worker's pipe and process sentinel
        (see [`poll_fds`][pipelined_vec_env.workers.waiting.poll_fds]).

        Args:
            handles: Handles to watch; those not pending are ignored.
            timeout: Seconds to wait, or None to wait while the workers are alive.
            wake_fd: A descriptor that also ends the wait when readable (it is not
                read), or None.

        Returns:
            Whether ``wake_fd`` was readable.
        """
        waiting = [h for h in handles if h.pending and h.answer is None]
        if not waiting and wake_fd is None:
            return False
        if waiting and wake_fd is None and timeout != 0 and _may_spin(waiting):
            received, timeout = _spin_and_receive(waiting, timeout)
            if received:
                return False
        if wake_fd is None:
            written = [h for h in waiting if h.answer_waiting()]
            if written:  # the slots say these answers are in the pipes: no poll needed
                for h in written:
                    h.receive()
                _read_deadline_kills(waiting)
                return False
        by_fd: dict[int, tuple[WorkerHandle, bool]] = {}
        for h in waiting:
            by_fd[h.fd] = (h, True)
            by_fd[h.sentinel] = (h, False)
        watched = list(by_fd) if wake_fd is None else [*by_fd, wake_fd]
        ready_fds = poll_fds(watched, timeout)
        for fd in ready_fds:
            if fd not in by_fd:
                continue
            h, is_conn = by_fd[fd]
            if not h.pending or h.answer is not None:
                continue
            if is_conn or h.conn.poll(0):
                h.receive()
            else:  # sentinel ready and nothing to read: the process is gone
                h.found_dead()
        return wake_fd is not None and wake_fd in ready_fds

    @staticmethod
    def written(
        handles: Sequence[WorkerHandle], timeout: float | None
    ) -> list[WorkerHandle] | None:
        """Those of ``handles`` (each with a slot, awaiting an answer not received yet)
        whose next answer is in their pipes: at once where their slots say so, else after
        one wait of at most ``timeout`` seconds, a bounded spin on the slots first where
        the caller may spin (as `receive_ready`), then a wait on their pipes and process
        sentinels. Nothing is read, except the answers a spin saw come (received, as
        `receive_ready` receives them: their ``answer`` is set).

        Returns:
            The handles with an answer waiting ([]: none within ``timeout``), or None when
            a process ended first (its sentinel: `receive_ready` reads the crash).
        """
        written = [h for h in handles if h.answer_waiting()]
        if written or timeout == 0:
            return written
        if _may_spin(handles):
            received, timeout = _spin_and_receive(handles, timeout)
            if received:  # read as they came, as `receive_ready` reads them
                return received
        fds = [h.fd for h in handles]
        ready = poll_fds([*fds, *(h.sentinel for h in handles)], timeout)
        if any(fd not in fds for fd in ready):
            return None
        # a readable pipe holds the answer (the slot's count may lag the pipe write)
        return [h for h in handles if h.fd in ready]

    @staticmethod
    def none_written(handles: Sequence[WorkerHandle]) -> bool:
        """Whether every one of ``handles`` has a slot whose answer counter says nothing
        was written that it has not read, no received answer waiting to be taken, and is
        not known dead: then a look at the pipes (a ``poll`` system call) would find
        nothing. A worker that died since is noticed by the next wait."""
        for h in handles:
            if h.slot is None or h.answer is not None or h.dead or h.answer_waiting():
                return False
        return True

    @staticmethod
    def spin_for_answers(handles: Sequence[WorkerHandle], seconds: float) -> None:
        """Spin on the slots' answer counters, yielding the core at each look, until one
        of ``handles`` has written an answer, at most ``seconds`` (at once where one has
        no slot); counted in each handle's ``wire.spins`` and, for the answers it saw,
        ``wire.spin_hits``. A dead worker is noticed by the `receive_ready` that
        follows (its sentinel)."""
        if not all(h.slot is not None for h in handles):
            return
        for h in handles:
            h.wire.spins += 1
        if spin_until(partial(_any_written, handles), seconds, yield_core=True):
            for h in handles:
                if h.answer_waiting():
                    h.wire.spin_hits += 1

    @staticmethod
    def find_dead(handles: Sequence[WorkerHandle], timeout: float = 10.0) -> None:
        """Mark dead every worker of ``handles`` that died while idle (nothing waited on
        it): a ``waitpid`` each (``timeout`` is not needed here)."""
        for h in handles:
            h.check_alive()

    @staticmethod
    def close_all(handles: Sequence[WorkerHandle], timeout: float) -> None:
        """Stop every worker in ``handles`` in parallel, within ``timeout`` seconds in all.

        Each live worker is asked to close its envs; their answers, and any answer nobody
        read (a step in flight, large observations through the pipe), are read and
        dropped as they come, so a worker blocked on a full pipe can go on to its
        ``close``. Workers still alive after ``timeout`` (hung, or busy in a long step) are
        terminated, then killed. Pipes are closed and processes reaped. Always returns.

        Args:
            handles: The workers.
            timeout: Seconds for the polite part, for all workers together; 0 skips it.
        """
        alive = [h for h in handles if h.is_alive()]
        if timeout > 0:
            for h in alive:
                if not h.dead:
                    with contextlib.suppress(OSError, ValueError):
                        send(h.conn, (Command.CLOSE, None))
            deadline = deadline_after(timeout)
            pipes = {h.conn.fileno(): h for h in alive if not h.dead and not h.conn.closed}
            sentinels = {h.process.sentinel: h for h in alive}
            last: dict[int, bytes] = {}  # per worker: the last frame read (its CLOSE answer)
            while sentinels and remaining(deadline):
                for fd in poll_fds([*pipes, *sentinels], remaining(deadline)):
                    if fd in sentinels:
                        sentinels.pop(fd)
                    elif fd in pipes:
                        _read_frame(pipes, fd, last)
            for fd in list(pipes):  # what exited workers wrote before they went
                while fd in pipes and _poll_pipe(pipes[fd]):
                    _read_frame(pipes, fd, last)
            for h in alive:
                if h.index in last:
                    _warn_failed_close(h, last[h.index])
            for h in alive:
                if h.is_alive():
                    stacks = h.dump_stacks()
                    logger.warning(
                        "worker %d did not close within timeout=%.3g s; terminating it. "
                        "Its threads' stacks:\n%s",
                        h.index,
                        timeout,
                        stacks or "(no dump)",
                    )
        for signal_name in ("terminate", "kill"):
            left = [h for h in alive if h.is_alive()]
            for h in left:
                with contextlib.suppress(OSError, ValueError):
                    getattr(h.process, signal_name)()
            _wait_all_sentinels(left, 1.0)
        for h in handles:
            with contextlib.suppress(OSError, ValueError):
                h.process.join(0 if not h.is_alive() else 0.1)
            h.release_resources()


def _poll_pipe(h: WorkerHandle) -> bool:
    try:
        return h.conn.poll(0)
    except (EOFError, OSError):
        return False


def _read_frame(pipes: dict[int, WorkerHandle], fd: int, last: dict[int, bytes]) -> None:
    """Read one frame from ``pipes[fd]`` into ``last``; forget the pipe at its end."""
    h = pipes[fd]
    try:
        last[h.index] = h.conn.recv_bytes()
    except (EOFError, OSError):
        pipes.pop(fd)


def _warn_failed_close(h: WorkerHandle, frame: bytes) -> None:
    """Warn when ``frame``, the last answer of closing worker ``h``, is a `Raised`."""
    if len(frame) <= 1:
        return
    try:
        answer = from_wire(pickle.loads(frame))
    except Exception:
        return
    if isinstance(answer, Raised):
        warnings.warn(
            f"worker {h.index} (envs {list(h.env_indices)}): closing its envs raised "
            f"{answer.type_name}: {answer.message}\nworker traceback:\n{answer.traceback}",
            RuntimeWarning,
            stacklevel=4,
        )


def _read_deadline_kills(handles: Sequence[WorkerHandle]) -> None:
    """Receive the answer, or the crash, of those of ``handles`` killed for overrunning
    ``step_deadline`` whose process has exited: a wait that found other answers written
    polls no sentinel, and would miss the kill for as long as the others keep answering."""
    for h in handles:
        if h.deadline_exceeded and h.answer is None and not h.dead and not h.is_alive():
            if _poll_pipe(h):
                h.receive()
            else:
                h.found_dead()


def _may_spin(waiting: Sequence[WorkerHandle]) -> bool:
    """Whether the caller's wait for the answers of ``waiting`` spins on their slots first."""
    # spin is 0 for every handle or for none
    return bool(waiting) and bool(waiting[0].spin) and all(h.may_spin() for h in waiting)


def _spin_and_receive(
    waiting: Sequence[WorkerHandle], timeout: float | None
) -> tuple[list[WorkerHandle], float | None]:
    """Spin on the slots of ``waiting`` until one has written an answer, at most
    `SPIN_SECONDS` and ``timeout`` (docs/wire_format.md, "What spins when"), and receive
    every answer written by then (those reads do not block; the spun wait is timed as
    it ends); counted in each handle's ``wire.spins`` and, for the answers it saw,
    ``wire.spin_hits``.

    Returns:
        The handles whose answer was received ([]: none came), and the timeout left
        (None stays None).
    """
    started = time.perf_counter()
    budget = SPIN_SECONDS if timeout is None else min(SPIN_SECONDS, timeout)
    for h in waiting:
        h.note_spin()
    if spin_until(
        partial(_any_written, waiting),
        budget,
        alive=lambda: all(h.process.is_alive() for h in waiting),
    ):
        received = [h for h in waiting if h.answer_waiting()]
        for h in received:
            h.wire.spin_hits += 1
            h.receive()
        return received, timeout
    if timeout is not None:
        timeout = max(0.0, timeout - (time.perf_counter() - started))
    return [], timeout


def _any_written(handles: Sequence[WorkerHandle]) -> bool:
    """Whether any of ``handles`` (with slots) has written an answer not read yet."""
    for h in handles:
        if h.answer_waiting():
            return True
    return False


def _wait_all_sentinels(handles: list[WorkerHandle], timeout: float) -> None:
    """Wait until every process of ``handles`` has exited, at most ``timeout`` s in all."""
    deadline = deadline_after(timeout)
    waiting = {h.process.sentinel for h in handles}
    while waiting and remaining(deadline):
        waiting -= set(poll_fds(list(waiting), remaining(deadline)))
