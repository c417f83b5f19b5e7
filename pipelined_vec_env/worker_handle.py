"""The multiprocessing backend: one worker's process and pipe, and waits on many workers.

`WorkerHandle` is the caller's side of one worker (start it, send it a command, read its
answer); `ProcessBackend` waits on several at once. Every wait watches the workers'
pipes *and* their process sentinels with one ``select.poll``, so a dead worker is noticed
at once instead of blocking forever (gymnasium's ``AsyncVectorEnv`` gives ``EOFError``
or hangs there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
import types
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .main_module import main_reference
from .protocol import Answer, Command, Crashed, from_wire
from .waiting import deadline_after, poll_fds, remaining
from .worker import send, worker_main

if TYPE_CHECKING:
    from .profiling import Profiler

__all__ = ["ProcessBackend", "WorkerHandle"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start workers without re-importing the caller's ``__main__`` script in them.

    ``spawn`` and ``forkserver`` children normally import the parent's main script (so
    that objects pickled by reference to ``__main__`` resolve). Most workers need nothing
    from it: env constructors are cloudpickled by value. Skipping it saves each worker the
    script's imports (seconds and hundreds of MB for a script that imports torch); a
    worker that does need it loads it then (see `main_module`). Not used with ``fork``,
    whose children have the parent's ``__main__`` for free.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class WorkerHandle:
    """One worker process and its pipe.

    Attributes:
        index: Worker index (global, across stages).
        env_indices: Global indices of its envs.
        stage: The stage it belongs to.
        pending: Answers are expected (commands were sent) and not all received yet.
        expected: How many answers are expected and not received yet (several when
            decoupled stepping queues commands on the worker).
        answer: The oldest received answer not consumed yet (a `pipelined_vec_env.protocol`
            answer: `Ok`, `Ready`, `Raised`, `Crashed` or `TimedOut`).
        profiler: The vector env's ``Profiler`` when profiling is on (else None): told of
            every send, answer, restart, deadline kill and death.
    """

    profiler: Profiler | None = None

    def __init__(
        self,
        ctx: Any,
        index: int,
        stage: int,
        env_indices: tuple[int, ...],
        pickled_env_fns: bytes,
        autoreset_mode: Any,
        cpu_cores: tuple[int, ...] | None,
        worker_threads: int | None,
        daemon: bool = True,
    ) -> None:
        self.index = index
        self.stage = stage
        self.env_indices = env_indices
        self.restarts = 0
        self._ctx = ctx
        self._args = (pickled_env_fns, autoreset_mode, cpu_cores, worker_threads)
        self._daemon = daemon
        self._start()

    def _start(self) -> None:
        self.expected = 0
        self.answer: Answer | None = None
        self.dead = False
        self.deadline_exceeded = False
        pickled_env_fns, autoreset_mode, cpu_cores, worker_threads = self._args
        forked = self._ctx.get_start_method() == "fork"
        self.conn, child_conn = self._ctx.Pipe(duplex=True)
        self.process = self._ctx.Process(
            target=worker_main,
            name=f"pipelined-vec-env-worker-{self.index}",
            args=(
                self.index,
                pickled_env_fns,
                self.env_indices,
                child_conn,
                os.getpid(),
                autoreset_mode,
                cpu_cores,
                worker_threads,
                None if forked else main_reference(),
            ),
            daemon=self._daemon,
        )
        if forked:
            self.process.start()
        else:
            with _main_module_hidden():
                self.process.start()
        child_conn.close()
        self.expected = 1  # the start-up "ready" message

    @property
    def pending(self) -> bool:
        """Whether answers are expected and not all received yet."""
        return self.expected > 0

    def restart(self, counted: bool = True) -> None:
        """Kill this worker's process (if alive) and start a fresh one for the same envs.

        The new process answers `Ready` at start-up (the pool waits for it).

        Args:
            counted: Count it in ``restarts`` (the ``max_restarts`` budget); False for
                the rebuild a reset of a dead worker's envs does.
        """
        self.close(timeout=0.0)
        self.restarts += int(counted)
        if self.profiler is not None:
            self.profiler.worker_restarted(self.index)
        self._start()

    def kill_for_deadline(self) -> None:
        """Kill a worker that overran its deadline; the wait then reports a crash."""
        self.deadline_exceeded = True
        if self.profiler is not None:
            self.profiler.deadline_kill(self.index)
        if self.process.is_alive():
            self.process.kill()

    def send(self, command: Command, payload: Any, expect_answer: bool = True) -> None:
        """Send one command; its answer is collected by `receive_ready` (through the pool).

        A worker found dead here is not reported at once: its answer is recorded as a
        crash, so the matching wait reports it (and the other workers of the call stay in
        step with the protocol).
        """
        if not self.dead:
            if self.profiler is not None:  # before the send: the worker may start at once
                self.profiler.command_sent(self.index, command)
            try:
                timed = self.profiler is not None  # ask for the worker's times
                send(self.conn, (command, payload, True) if timed else (command, payload))
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                self._mark_dead()
        if self.dead:
            if expect_answer and self.answer is None:
                self.answer = Crashed(self.process.exitcode)
            self.expected = 0
            return
        self.expected += int(expect_answer)

    @property
    def exitcode(self) -> int | None:
        """The process's exit code (None while it runs)."""
        return self.process.exitcode

    @property
    def pid(self) -> int | None:
        """The worker process's id."""
        return self.process.pid

    def take(self) -> Answer:
        """Return and clear the received answer."""
        assert self.answer is not None
        answer, self.answer = self.answer, None
        return answer

    def recv_answer(self) -> Answer:
        """Read one answer from the pipe (blocks; raises EOFError if the worker is gone).

        The worker's start and finish times that ride on an `Ok` answer go to the
        profiler (when on).
        """
        answer = from_wire(pickle.loads(self.conn.recv_bytes()))
        if self.profiler is not None:
            self.profiler.answer_received(self.index, answer.kind, getattr(answer, "times", None))
        return answer

    def _mark_dead(self) -> None:
        self.dead = True
        self.process.join(timeout=1.0)
        if self.profiler is not None:
            self.profiler.worker_died(self.index, self.process.exitcode)

    def check_alive(self) -> bool:
        """Whether the process is alive (a cheap ``waitpid``); one found dead is marked so,
        even if nothing was waiting on it (a worker that died while idle)."""
        if not self.dead and not self.process.is_alive():
            self._mark_dead()
        return not self.dead

    def _receive(self) -> None:
        try:
            self.answer = self.recv_answer()
            self.expected -= 1
        except (EOFError, ConnectionResetError, OSError):
            self._mark_dead()
            self.answer = Crashed(self.process.exitcode)
            self.expected = 0

    def close(self, timeout: float = 5.0) -> None:
        """Stop the process: ask politely, then terminate, then kill. Always returns."""
        if self.process.is_alive() and not self.dead and timeout > 0:
            try:
                send(self.conn, (Command.CLOSE, None))
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(1.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(1.0)
        self.conn.close()
        try:
            self.process.close()
        except ValueError:
            logger.warning("worker %d could not be reaped", self.index)


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
        (see [`poll_fds`][pipelined_vec_env.waiting.poll_fds]).

        Args:
            handles: Handles to watch; those not pending are ignored.
            timeout: Seconds to wait, or None to wait while the workers are alive.
            wake_fd: A descriptor that also ends the wait when readable (it is not
                read), or None.

        Returns:
            Whether ``wake_fd`` was readable.
        """
        by_fd: dict[int, tuple[WorkerHandle, bool]] = {}
        for h in handles:
            if h.pending and h.answer is None:
                by_fd[h.conn.fileno()] = (h, True)
                by_fd[h.process.sentinel] = (h, False)
        if not by_fd and wake_fd is None:
            return False
        watched = list(by_fd) if wake_fd is None else [*by_fd, wake_fd]
        ready_fds = poll_fds(watched, timeout)
        for fd in ready_fds:
            if fd not in by_fd:
                continue
            h, is_conn = by_fd[fd]
            if not h.pending or h.answer is not None:
                continue
            if is_conn or h.conn.poll(0):
                h._receive()
            else:  # sentinel ready and nothing to read: the process is gone
                h._mark_dead()
                h.answer = Crashed(h.process.exitcode)
                h.expected = 0
        return wake_fd is not None and wake_fd in ready_fds

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
        alive = [h for h in handles if _is_alive(h)]
        if timeout > 0:
            for h in alive:
                if not h.dead:
                    with contextlib.suppress(OSError, ValueError):
                        send(h.conn, (Command.CLOSE, None))
            deadline = deadline_after(timeout)
            pipes = {h.conn.fileno(): h for h in alive if not h.dead and not h.conn.closed}
            sentinels = {h.process.sentinel: h for h in alive}
            while sentinels and remaining(deadline):
                for fd in poll_fds([*pipes, *sentinels], remaining(deadline)):
                    if fd in sentinels:
                        sentinels.pop(fd)
                    elif fd in pipes:
                        try:
                            pipes[fd].conn.recv_bytes()  # an unread answer: drop it
                        except (EOFError, OSError):
                            pipes.pop(fd)
        for signal_name in ("terminate", "kill"):
            left = [h for h in alive if _is_alive(h)]
            for h in left:
                with contextlib.suppress(OSError, ValueError):
                    getattr(h.process, signal_name)()
            _wait_all_sentinels(left, 1.0)
        for h in handles:
            with contextlib.suppress(OSError, ValueError):
                h.process.join(0 if not _is_alive(h) else 0.1)
            h.conn.close()
            try:
                h.process.close()
            except ValueError:
                logger.warning("worker %d could not be reaped", h.index)


def _is_alive(h: WorkerHandle) -> bool:
    try:
        return h.process.is_alive()
    except ValueError:  # the process object was closed already
        return False


def _wait_all_sentinels(handles: list[WorkerHandle], timeout: float) -> None:
    """Wait until every process of ``handles`` has exited, at most ``timeout`` s in all."""
    deadline = deadline_after(timeout)
    waiting = {h.process.sentinel for h in handles}
    while waiting and remaining(deadline):
        waiting -= set(poll_fds(list(waiting), remaining(deadline)))
