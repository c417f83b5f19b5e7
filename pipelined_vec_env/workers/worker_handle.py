"""The multiprocessing backend's side of one worker: its process and pipe (`WorkerHandle`).

`WorkerHandle` is the caller's side of one worker: start it, send it a command (a step
through its shared-memory slot on the fast path), read its answer, restart and close it.
The waits on several workers at once are
[`ProcessBackend`][pipelined_vec_env.workers.process_backend.ProcessBackend]'s
(``process_backend.py``; importable from here too).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
import time
import types
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..stacks import StackFile
from .main_module import main_reference
from .process_backend import ProcessBackend
from .protocol import Answer, Command, Crashed, Ok, Ready, from_wire, untag_wire
from .slots import (
    FAST_INFOS,
    WAKE_STEP,
    WAKE_STEP_TIMED,
    SlotRead,
    StepSlot,
    recv_frame,
    send_short,
)
from .spinning import SpinGate, machine_quiet
from .worker import send, worker_main

if TYPE_CHECKING:
    from ..profiling.profiler import Profiler

__all__ = ["ProcessBackend", "WireStats", "WorkerHandle"]

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


# what a received answer is to: a pickled command, or a fast step of that many envs
_PICKLED = -1


class WireStats:
    """Counts of one worker's messages by path (for tests, benchmarks and debugging).

    Attributes:
        fast_steps: Steps sent through the slot (actions in shared memory, a one-byte wake).
        pickled_steps: Steps sent pickled (the fast path was off, the actions did not fit
            the slot, or another command of the worker was in flight).
        fast_answers: Step answers with their results in the slot and no infos pickled.
        info_answers: Step answers with results in the slot and infos pickled beside.
        wakeless_steps: Of the fast steps, those sent without a pipe write: the worker
            was spinning on the slot for its next message.
        spins: Waits for an answer that spun on the slot.
        spin_hits: Of those, the ones that saw the answer coming without sleeping.
    """

    __slots__ = (
        "fast_answers",
        "fast_steps",
        "info_answers",
        "pickled_steps",
        "spin_hits",
        "spins",
        "wakeless_steps",
    )

    def __init__(self) -> None:
        self.fast_steps = self.pickled_steps = self.fast_answers = self.info_answers = 0
        self.spins = self.spin_hits = self.wakeless_steps = 0

    def as_dict(self) -> dict[str, int]:
        """The counts by name."""
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"WireStats({self.as_dict()})"


class WorkerHandle:
    """One worker process and its pipe.

    With ``fast_path`` (and an action space of a fixed array layout: Box, Discrete,
    MultiDiscrete, MultiBinary) the handle gives its worker a `slots.StepSlot` once the
    worker is up: a ``step`` whose actions are a numpy array of the space's dtype and
    shape, sent while nothing else is in flight on the worker, travels through it (see
    docs/wire_format.md). With ``spin`` the wait for a quick answer spins on the slot
    before sleeping in ``poll``.

    Attributes:
        index: Worker index (global, across stages).
        env_indices: Global indices of its envs.
        stage: The stage it belongs to.
        pending: Answers are expected (commands were sent) and not all received yet.
        expected: How many answers are expected and not received yet (several when
            decoupled stepping queues commands on the worker).
        answer: The oldest received answer not consumed yet (a `pipelined_vec_env.workers.protocol`
            answer: `Ok`, `Ready`, `Raised`, `Crashed` or `TimedOut`).
        answer_tag: The local index of the env whose `Command.STEP_ENV` ``answer``
            answers (such answers may come out of order), else None.
        profiler: The vector env's ``Profiler`` when profiling is on (else None): told of
            every send, answer, restart, deadline kill and death.
        fast_path: Whether steps may use the slot.
        spin: 0: the caller's waits never spin; else the number of processes of the
            vector env (its workers and the caller), set where each can have a core
            (`spinning.can_spin`): the caller's waits then spin on the slot while the
            machine's load leaves those processes their cores (`spinning.machine_quiet`).
        worker_spin: Whether the worker may spin for its next message, yielding its core
            at each look (set where each worker can have a core: the caller then takes a
            spinner's core when it needs one), so that a fast step sent meanwhile needs
            no pipe write (`slots`, docs/wire_format.md "What spins when").
        slot: The current process's slot (None: none yet, or no fixed action layout).
        fd: The caller's end of the current process's pipe, as a descriptor (-1 once
            closed).
        sentinel: The current process's sentinel (readable once it exited).
        wire: `WireStats` of the worker (all its processes).
        spin_gate: ``spin_gate(spin)`` tells whether the machine's load leaves the cores
            free for a spin now (`spinning.machine_quiet`; replaceable, e.g. by tests).
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
        fast_path: bool = True,
        spin: int = 0,
        worker_spin: bool = False,
    ) -> None:
        self.index = index
        self.stage = stage
        self.env_indices = env_indices
        self.restarts = 0
        self.fast_path = fast_path
        self.spin = spin
        self.worker_spin = worker_spin
        self.slot: StepSlot | None = None
        self.wire = WireStats()
        self.spin_gate = machine_quiet
        self._ctx = ctx
        self._args = (pickled_env_fns, autoreset_mode, cpu_cores, worker_threads)
        self._daemon = daemon
        self._start()

    def _start(self) -> None:
        self.expected = 0
        self.answer: Answer | None = None
        self.answer_tag: int | None = None
        self.dead = False
        self.deadline_exceeded = False
        #: every thread's stack, dumped just before a deadline kill (else None)
        self.stacks: str | None = None
        self.release_slot()
        # per expected answer: (_PICKLED or the envs of a fast step, timed, sent at)
        self._awaited: deque[tuple[int, bool, float]] = deque()
        #: the last fast answer, while its results may still be only in the slot
        self._in_slot: SlotRead | None = None
        self._received = 0  # answers read since the slot came
        self._latency = SpinGate()  # send-to-answer times of the waits that spun
        self._spun = False  # whether the wait for the next answer spun
        pickled_env_fns, autoreset_mode, cpu_cores, worker_threads = self._args
        forked = self._ctx.get_start_method() == "fork"
        self._stack_file = StackFile()
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
                self._stack_file.path,
            ),
            daemon=self._daemon,
        )
        if forked:
            self.process.start()
        else:
            with _main_module_hidden():
                self.process.start()
        child_conn.close()
        # looked up once: the pipe's descriptor and the process's sentinel (each wait
        # watches both, each fast step writes and reads the pipe)
        self.fd, self.sentinel = self.conn.fileno(), self.process.sentinel
        self.expected = 1  # the start-up "ready" message
        self._awaited.append((_PICKLED, False, time.perf_counter()))

    def _attach_slot(self, description: dict[str, Any]) -> None:
        """Give the freshly started worker its slot (when its actions have a fixed
        layout); sent right after its `Ready` was read, before anything else."""
        spaces_ = description.get("action_spaces") or []
        if not self.fast_path or not spaces_ or any(a != spaces_[0] for a in spaces_):
            return
        try:
            slot = StepSlot(spaces_[0], len(self.env_indices))
        except TypeError:
            return  # no fixed action layout: every step goes pickled
        except OSError as exc:  # no room in /dev/shm (ENOSPC): every step goes pickled
            logger.warning("worker %d: no step slot, steps go pickled: %s", self.index, exc)
            return
        try:
            send(self.conn, (Command.ATTACH_SLOT, (slot, self.worker_spin)))
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            slot.release()
            return  # its death is read by the next wait
        self.slot, self._received = slot, 0

    def release_slot(self) -> None:
        """Unmap and remove the slot (the process is gone or going)."""
        self._keep_results()
        slot, self.slot = getattr(self, "slot", None), None
        if slot is not None:
            slot.release()

    def _keep_results(self) -> None:
        """Copy the last fast answer's results out of the slot (before it is written
        again or released), unless they were used already."""
        last = getattr(self, "_in_slot", None)
        if last is not None:
            last.keep()
            self._in_slot = None

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

    def dump_stacks(self, timeout: float = 1.0) -> str | None:
        """Every thread's Python stack in the live worker, without stopping it.

        Args:
            timeout: Seconds to wait for the dump.

        Returns:
            `faulthandler`'s text (most recent call first), or None when the worker is
            gone or did not write it within ``timeout``.
        """
        if self.dead or not self.is_alive():
            return None
        return self._stack_file.request(self.process.pid, timeout)

    def remove_stack_file(self) -> None:
        """Delete the file the worker dumps its stacks into (it is going)."""
        self._stack_file.remove()

    def kill_for_deadline(self) -> None:
        """Dump the stacks of a worker that overran its deadline (into ``stacks``), then
        kill it; the wait then reports a crash."""
        self.deadline_exceeded = True
        if self.profiler is not None:
            self.profiler.deadline_kill(self.index)
        if self.process.is_alive():
            self.stacks = self.dump_stacks()
            self.process.kill()

    def send(self, command: Command, payload: Any, expect_answer: bool = True) -> None:
        """Send one command; its answer is collected by `receive_ready` (through the pool).

        A worker found dead here is not reported at once: its answer is recorded as a
        crash, so the matching wait reports it (and the other workers of the call stay in
        step with the protocol).
        """
        if self._in_slot is not None:  # the worker may write the slot again now
            self._keep_results()
        if not self.dead:
            if self.profiler is not None:  # before the send: the worker may start at once
                env = payload[0] if command == Command.STEP_ENV else None
                self.profiler.command_sent(self.index, command, env)
            timed = self.profiler is not None  # ask for the worker's times
            kind = _PICKLED
            try:
                slot = self.slot
                if slot is not None and command == Command.STEP and self.expected == 0:
                    kind = self._write_fast_step(slot, payload)
                # each message is counted in the slot after its write: a spinning worker
                # that sees the count finds the frame there
                if kind == _PICKLED:
                    send(self.conn, (command, payload, True) if timed else (command, payload))
                    if slot is not None:
                        slot.note_sent()
                elif slot.worker_spins_for_next():  # it sees the step in the slot: no write
                    slot.note_sent_wakeless(WAKE_STEP_TIMED if timed else WAKE_STEP)
                    self.wire.wakeless_steps += 1
                else:
                    send_short(self.fd, WAKE_STEP_TIMED if timed else WAKE_STEP)
                    slot.note_sent()
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                self._mark_dead()
            if command == Command.STEP:
                if kind == _PICKLED:
                    self.wire.pickled_steps += 1
                else:
                    self.wire.fast_steps += 1
        if self.dead:
            if expect_answer and self.answer is None:
                self.answer, self.answer_tag = Crashed(self.process.exitcode), None
            self.expected = 0
            self._awaited.clear()
            return
        if expect_answer:
            self.expected += 1
            # the send time feeds the spin's latency estimate only (0.0: not timed)
            self._awaited.append((kind, timed, time.perf_counter() if self.spin else 0.0))

    @staticmethod
    def _write_fast_step(slot: StepSlot, payload: Any) -> int:
        """Write a step's request into ``slot`` if its actions fit; return the envs it
        steps, or _PICKLED (nothing written) when it must go pickled."""
        local_indices, actions, generation = payload
        count = slot.n if local_indices is None else len(local_indices)
        if not slot.accepts(actions, count):
            return _PICKLED
        slot.write_request(local_indices, actions, generation)
        return count

    def note_spin(self) -> None:
        """Count a spin of the caller's wait for this worker's next answer
        (``wire.spins``); that answer's wait then feeds the spin's latency estimate."""
        self.wire.spins += 1
        self._spun = True

    def may_spin(self) -> bool:
        """Whether a wait for this worker's next answer may spin on the slot: spinning is
        on, its recent answers came within the spin's budget, and nothing else keeps
        the machine busy (`spinning.machine_quiet`)."""
        return (
            bool(self.spin)
            and self.slot is not None
            and self.spin_gate(self.spin)
            and self._latency.allows()
        )

    def answer_waiting(self) -> bool:
        """Whether the worker has written an answer not read yet."""
        slot = self.slot
        return slot is not None and slot.answers_sent() > self._received

    def is_alive(self) -> bool:
        """Whether the current process is alive (False once its process object is closed)."""
        try:
            return self.process.is_alive()
        except ValueError:  # the process object was closed already
            return False

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
        data = recv_frame(self.fd)
        tag = None  # a `Command.STEP_ENV`'s answer: its env's local index
        kind, timed, sent_at = self._awaited.popleft() if self._awaited else (_PICKLED, False, 0.0)
        slot = self.slot
        if slot is not None:
            self._received += 1
            if sent_at and self._spun:
                self._spun = False
                self._latency.record(time.perf_counter() - sent_at)
        if len(data) == 1 or kind != _PICKLED:
            message: Any = data if len(data) == 1 else pickle.loads(data)
            if isinstance(message, bytes) or message[0] == FAST_INFOS:
                assert slot is not None and kind != _PICKLED, "a fast answer to no fast step"
                if isinstance(message, tuple):
                    self.wire.info_answers += 1
                    if message[2] is not None:  # the worker learnt a new info layout
                        slot.layout = message[2]
                else:
                    self.wire.fast_answers += 1
                # the results stay in the slot until used, or kept at the next send
                self._in_slot = SlotRead(slot, kind, message)
                answer: Answer = Ok(self._in_slot, slot.times() if timed else None)
            else:
                answer = from_wire(message)
        else:
            wire, tag = untag_wire(pickle.loads(data))
            answer = from_wire(wire)
        self.answer_tag = tag
        if self.profiler is not None:
            times = getattr(answer, "times", None)
            self.profiler.answer_received(self.index, answer.kind, times, tag)
        if isinstance(answer, Ready):
            self._attach_slot(answer.description)
        return answer

    def close_pipe(self) -> None:
        """Close the caller's end of the pipe (a later send or read fails as for a dead
        worker: the descriptor is forgotten, never reused)."""
        self.conn.close()
        self.fd = -1

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

    def receive(self) -> None:
        """Read the worker's next answer into `answer` (a dead worker's is `Crashed`)."""
        try:
            self.answer = self.recv_answer()
            self.expected -= 1
        except (EOFError, ConnectionResetError, OSError):
            self.found_dead()

    def found_dead(self) -> None:
        """The process is gone: its answer is a crash and nothing more is expected."""
        self._mark_dead()
        self.answer, self.answer_tag = Crashed(self.process.exitcode), None
        self.expected = 0
        self._awaited.clear()

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
        self.release_resources()

    def release_resources(self) -> None:
        """Once the process has exited (or been killed): close the pipe, release the slot
        and the stack file, reap the process. Logs a warning where it cannot be reaped."""
        self.close_pipe()
        self.release_slot()
        self.remove_stack_file()
        try:
            self.process.close()
        except ValueError:
            logger.warning("worker %d could not be reaped", self.index)
