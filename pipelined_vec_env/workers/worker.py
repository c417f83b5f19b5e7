"""The worker protocol: what runs inside each subprocess and the messages it exchanges.

A worker owns one or several envs (``envs_per_worker``), built inside it from
cloudpickled constructors, so simulators never share a process with the caller. It
serves one command at a time from its pipe and answers each with exactly one message,
except `Command.STEP_ENV`: each starts on the worker's threads as it is read and is
answered, tagged with its env, as soon as that env stepped (`EnvSteps`); any other command
waits for the env steps read before it.

Commands and answers are the typed ones of [`pipelined_vec_env.workers.protocol`][pipelined_vec_env.workers.protocol]
(`Command`, `Ok`, `Raised`, `Ready`): a message from the caller is ``(command, payload)``,
or ``(command, payload, True)`` while profiling, which asks for the worker's start and
finish times (``time.monotonic_ns``) in the `Ok` answer. At start-up the worker sends
`Ready` with its envs' spaces, metadata, render mode and spec, or `Raised`.
``obs_items`` is ``None`` when observations were written to shared memory, else a list of
one observation per env. ``infos[i]`` is a list of info dicts that the caller merges in
order with gymnasium's rules (under ``SAME_STEP`` autoreset a finished env contributes
``{"final_obs", "final_info"}`` then its reset info, as ``SyncVectorEnv`` does).
`serve_command` is the one dispatch, used by the worker process and the Ray actor.

The envs of one worker, their stepping and autoreset state are a
[`WorkerEnvs`][pipelined_vec_env.workers.worker_envs.WorkerEnvs]; the process's set-up
(dying with the caller, thread caps, cores, nice value) is
[`process_setup`][pipelined_vec_env.workers.process_setup]'s; `THREAD_ENV_VARS`,
`NicedEnvFn` and `set_worker_nice` are importable from here too. An answer that cannot be
pickled becomes a `Raised` naming the env and key of the value at fault
([`answer_pickling`][pipelined_vec_env.workers.answer_pickling]).
"""

from __future__ import annotations

import logging
import pickle
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
from gymnasium import Env
from gymnasium.error import UnregisteredEnv
from gymnasium.vector import AutoresetMode

from ..gl_contexts import own_gl_contexts
from ..stacks import install_stack_dump
from .answer_pickling import answer_locator, pickle_answer, step_locator
from .main_module import install_lazy_main, load_main
from .process_setup import (
    THREAD_ENV_VARS,
    NicedEnvFn,
    die_with_parent,
    limit_threads,
    limit_torch_threads,
    parent_alive,
    release_forkserver,
    set_affinity,
    set_worker_nice,
    watch_parent,
)
from .protocol import Answer, Command, Ok, Raised, Ready, StepRequest, tag_wire, to_wire
from .slots import (
    DONE_COLUMNS,
    DONE_EMPTY,
    FAST_INFOS,
    WAKE_STEP_TIMED,
    InfoLayout,
    StepSlot,
    recv_frame,
    send_short,
)
from .spinning import YIELD_SPIN_SECONDS, SpinGate, spin_until
from .worker_envs import WorkerEnvs

__all__ = [
    "THREAD_ENV_VARS",
    "NicedEnvFn",
    "build_env",
    "send",
    "send_answer",
    "serve_command",
    "set_worker_nice",
    "spin_for_message",
    "worker_main",
]

logger = logging.getLogger(__name__)


def send(conn: Connection, message: Any) -> None:
    """Send one protocol message.

    Plain `pickle.dumps` (protocol 5) and ``send_bytes``: the same framing as
    ``Connection.send`` but without building a ``ForkingPickler`` per message, which
    costs more than the message itself for small steps. Nothing we send carries file
    descriptors, so ``ForkingPickler``'s reducers are not needed.
    """
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def send_answer(conn: Connection, message: Any) -> None:
    """Send an answer; one that plain pickle refuses goes by cloudpickle instead.

    Plain pickle refuses an object of a class the worker got by value (a class defined
    in the caller's script travels inside the env constructor): it is not the same
    object as `__main__.ThatClass`. cloudpickle sends the class by value again, with the
    id cloudpickle gave it in the caller, so the caller's unpickling returns an instance
    of its own class (`isinstance` holds). Only such answers pay for a second pickling.

    Raises:
        pickle.PicklingError / TypeError / AttributeError: Neither can pickle it (nothing
            was written to the pipe).
    """
    try:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        data = cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    conn.send_bytes(data)


def build_env(fn: Any) -> Env:
    """Call one env constructor; an env id the worker does not know is retried once after
    loading the caller's main script, which may register it (see `main_module`). A
    gymnasium MuJoCo env then renders through its own GL contexts (`gl_contexts`), so
    that envs sharing the worker never draw in each other's.

    Raises:
        gymnasium.error.UnregisteredEnv: The id is unknown even after loading the script
            (or there is no script to load).
        Exception: Whatever the constructor raises.
    """
    try:
        return own_gl_contexts(fn())
    except UnregisteredEnv:
        if not load_main():
            raise
    return own_gl_contexts(fn())


def worker_main(
    worker_index: int,
    pickled_env_fns: bytes,
    env_indices: tuple[int, ...],
    conn: Connection,
    parent_pid: int,
    autoreset_mode: AutoresetMode,
    cpu_cores: tuple[int, ...] | None,
    worker_threads: int | None,
    main_ref: tuple[str, str] | None = None,
    stacks_path: str | None = None,
) -> None:
    """Serve commands for the envs ``env_indices`` until ``close`` or the caller goes away.

    Args:
        worker_index: This worker's index (for messages).
        pickled_env_fns: cloudpickled list of env constructors, one per env (each a
            `ByValue`: the envs share no object).
        env_indices: Global indices of those envs in the vector env.
        conn: This worker's end of the pipe.
        parent_pid: Pid of the process that owns the vector env; the worker exits when it
            disappears.
        autoreset_mode: gymnasium's autoreset mode, applied per env inside the worker.
        cpu_cores: Cores to pin this process to with ``os.sched_setaffinity``, or None.
        worker_threads: Cap for OpenMP/BLAS/torch threads, or None to leave them alone.
        main_ref: The caller's main module (`main_module.main_reference()`), loaded here
            only if something needs it; None when the worker has it already (fork).
        stacks_path: File to dump every thread's stack into on `stacks.DUMP_SIGNAL`
            (`stacks.install_stack_dump`), or None.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    install_stack_dump(stacks_path)
    release_forkserver()
    if not die_with_parent() or not parent_alive(parent_pid):
        return
    try:
        limit_threads(worker_threads)
        set_affinity(cpu_cores)
        install_lazy_main(main_ref)
        env_fns = cloudpickle.loads(pickled_env_fns)
        envs = WorkerEnvs([build_env(fn) for fn in env_fns], env_indices, autoreset_mode)
        limit_torch_threads(worker_threads)
        send(conn, to_wire(Ready(envs.describe())))
    except BaseException as exc:  # report start-up failures, then exit
        try:
            send(conn, to_wire(Raised.from_exception(exc)))
        finally:
            conn.close()
        return

    try:
        _serve(envs, conn, parent_pid)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the caller went away; nothing to answer
    finally:
        envs.detach()  # unmap shared memory cleanly
        try:
            envs.close()
        except Exception:
            logger.debug("env close failed in worker %d", worker_index, exc_info=True)
        conn.close()


def serve_command(envs: WorkerEnvs, command: Command, payload: Any) -> Answer | None:
    """Serve one command on ``envs`` and return its answer (None for `NO_ANSWER` commands).

    The one dispatch of the protocol, for the worker process and the Ray actor. An
    exception from the envs becomes `Raised`; after `Command.CLOSE` the envs are closed
    and dropped.
    """
    if command == Command.ATTACH:
        envs.attach(*payload)
        return None
    if command == Command.SET_AUTORESET:
        for local in payload:  # these envs reset on their next step
            envs.autoreset[local] = True
        return None
    try:
        if command == Command.STEP:
            return Ok(envs.step(payload))
        if command == Command.STEP_ENV:  # in order here (the Ray actor's serial calls)
            local, rows = payload
            return Ok(envs.step(StepRequest([local], rows)))
        if command == Command.RESET:
            return Ok(envs.reset(payload))
        if command == Command.CALL:
            return Ok(envs.call(*payload))
        if command == Command.SET_ATTR:
            return Ok(envs.set_attr(*payload))
        if command == Command.CLOSE:
            envs.close()  # drops the envs even when one raised
            return Ok(None)
        raise RuntimeError(f"unknown worker command {command!r}")
    except Exception as exc:
        return Raised.from_exception(exc)


class _FastPath:
    """The worker's side of the step fast path (`slots`): its slot, the messages received
    since the slot came, and whether and how long to spin for the next one."""

    def __init__(self) -> None:
        self.slot: StepSlot | None = None
        self.received = 0
        self.answered_at = 0.0
        self.gap = SpinGate(YIELD_SPIN_SECONDS)  # answer-to-next-message times of spun waits
        self.spun = False  # whether the wait for the next message spun
        self.fd = -1  # the pipe's descriptor (set by the serve loop)
        self.can_spin = False  # whether the waits may spin (set with the slot)
        self.spins_for = 0  # the message the next wait spins for (0: it sleeps)
        self.concurrent = False  # what the slot says of the worker's stepping

    def attach(self, slot: StepSlot, spin: bool) -> None:
        if self.slot is not None:
            self.slot.release()
        self.slot, self.received = slot, 0
        self.concurrent = False
        self.can_spin = spin  # the pool decided it (`spinning.can_spin` of the workers)

    def next_frame(self, readable: Callable[..., Any]) -> bytes:
        """The caller's next message: a one-byte fast step wake-up or a pickled frame.

        While the caller has been quick to send the next message after each answer (its
        `SpinGate`), the worker spins for it on the slot, yielding its core at each look
        (`spinning.spin_until` with ``yield_core``: a simulator runnable on that core runs
        first). It says so in the slot before it writes the answer (`answer`), since the
        caller it wakes may take its core at once: a fast step sent from then on comes
        through the slot alone, without a pipe write to wake the worker
        (docs/wire_format.md, "What spins when"; `spin_for_message`).

        Raises:
            EOFError: The caller closed the pipe.
        """
        slot, number = self.slot, self.spins_for
        if slot is not None and number:
            self.spins_for = 0
            self.spun = True
            wakeless = spin_for_message(slot, number, readable)
            if wakeless is not None:
                return wakeless
        readable()
        return recv_frame(self.fd)  # EOFError: the caller is gone

    def received_one(self) -> None:
        if self.slot is None:
            return
        self.received += 1
        if self.spun:
            self.spun = False
            if self.answered_at:
                self.gap.record(time.perf_counter() - self.answered_at)

    def answer(self, conn: Connection, data: bytes) -> None:
        """Write an answer to the pipe, then count it in the slot (a spinning caller that
        sees the count finds the answer there). Before the write, decide whether the
        wait for the next message spins, and say so in the slot (`next_frame`)."""
        slot = self.slot
        if slot is not None and self.can_spin and self.gap.allows():
            self.spins_for = self.received + 1
            slot.spin_for(self.spins_for)
        if len(data) == 1:
            send_short(self.fd, data)
        else:
            conn.send_bytes(data)
        if slot is not None:
            slot.note_answered()
            self.answered_at = time.perf_counter()

    def answer_tagged(self, conn: Connection, data: bytes) -> None:
        """Write an env step's answer from one of the worker's threads (`EnvSteps`, under
        its lock), then count it in the slot; no spin is announced (the serve loop's
        thread decides those, for the answers it writes)."""
        conn.send_bytes(data)
        if self.slot is not None:
            self.slot.note_answered()

    def note_mode(self, envs: WorkerEnvs) -> None:
        """Say in the slot whether the worker steps its envs concurrently (decoupled
        stepping then sends them one `Command.STEP_ENV` each) and no serial measurement
        window is due (`StepProfile.concurrent_now`): one store when it changed."""
        slot = self.slot
        if slot is None or len(envs.envs) < 2:
            return
        concurrent = envs.profile.concurrent_now()
        if concurrent != self.concurrent:
            slot.set_concurrent(concurrent)
            self.concurrent = concurrent

    def release(self) -> None:
        if self.slot is not None:
            self.slot.release()
            self.slot = None


class EnvSteps:
    """The `Command.STEP_ENV` steps of one worker: each starts on the worker's threads as
    its command is read (the serve loop reads ahead while they run) and is answered as
    soon as it is done, tagged with its env (`protocol.tag_wire`), so the caller receives
    the envs in the order they finish. Any other command waits until every env step read
    before it was answered (`drain`): the worker's answers to the others stay in order."""

    def __init__(self, envs: WorkerEnvs, fast: _FastPath, conn: Connection) -> None:
        self.envs, self.fast, self.conn = envs, fast, conn
        self.lock = threading.Lock()  # one answer written at a time
        self.running: dict[int, Future] = {}

    def start(self, payload: tuple[int, Any], timed: bool) -> None:
        """Start the step of env ``payload[0]`` with the actions ``payload[1]`` (one row)."""
        local = payload[0]
        earlier = self.running.pop(local, None)
        if earlier is not None:  # the same env again: after its earlier step
            earlier.result()
        profile = self.envs.profile
        profile.count_env_step()
        self.running[local] = profile.submit(self._step, local, payload[1], timed)

    def _step(self, local: int, rows: Any, timed: bool) -> None:
        envs = self.envs
        started = time.monotonic_ns() if timed else 0
        request = StepRequest([local], rows)
        answer: Answer
        try:
            answer = Ok(envs.step(request, direct=True))
        except Exception as exc:
            answer = Raised.from_exception(exc)
        if timed and isinstance(answer, Ok):
            answer.times = (started, time.monotonic_ns())
        locate = answer_locator(envs, Command.STEP, request, answer)
        data = pickle_answer(to_wire(answer), locate)
        message = pickle.dumps(tag_wire(local, data), protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:
            self.fast.answer_tagged(self.conn, message)

    def drain(self) -> None:
        """Wait until every env step started was answered (a failed write: the caller is
        gone, which the serve loop's next read finds)."""
        if not self.running:
            return
        running, self.running = self.running, {}
        for future in running.values():
            try:
                future.result()
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass


def spin_for_message(
    slot: StepSlot,
    number: int,
    readable: Callable[..., Any],
    seconds: float = YIELD_SPIN_SECONDS,
) -> bytes | None:
    """Wait for the caller's message ``number`` on ``slot`` (announced with
    `StepSlot.spin_for`): spin for it up to ``seconds``, yielding the core at each look,
    then sleep in timed polls of the pipe (1 ms, doubling to 0.1 s) until it comes.

    A caller that saw the spin just before it ended sends the message through the slot
    alone (`StepSlot.note_sent_wakeless`) to a worker that no longer spins: the timed
    polls bound that message's wait by one timeout.

    Args:
        slot: The worker's slot.
        number: The message waited for (messages since the slot came, from 1).
        readable: ``readable(timeout_ms)``: a wait on the pipe, returning what is ready.
        seconds: The spin's budget.

    Returns:
        The one-byte wake-up (`WAKE_STEP` or `WAKE_STEP_TIMED`) of a message that came
        through the slot alone; None when the message is in the pipe (or the pipe closed).
    """
    received = number - 1
    spin_until(lambda: slot.messages_sent() > received, seconds, yield_core=True)
    slot.spin_for(0)
    timeout = 1.0  # ms
    while slot.messages_sent() <= received and not readable(timeout):
        timeout = min(2 * timeout, 100.0)
    return slot.wakeless(number)


def _fast_step(envs: WorkerEnvs, fast: _FastPath, conn: Connection, timed: bool) -> None:
    """Serve one fast step: actions from the slot, results into it, a short answer."""
    slot = fast.slot
    assert slot is not None, "a fast step before the slot"
    started = time.monotonic_ns() if timed else 0
    request = slot.read_request()
    try:
        items, rewards, terminations, truncations, infos = envs.step_arrays(request)
    except Exception as exc:
        fast.answer(conn, pickle_answer(to_wire(Raised.from_exception(exc))))
        return
    if timed:
        slot.write_times(started, time.monotonic_ns())
    if items is not None:  # observations travel through the pipe: the pickled answer
        payload = (items, rewards.tolist(), terminations.tolist(), truncations.tolist(), infos)
        times = (started, time.monotonic_ns()) if timed else None
        locate = step_locator(envs, request, items, infos)
        fast.answer(conn, pickle_answer(to_wire(Ok(payload, times)), locate))
        return
    slot.write_results(rewards, terminations, truncations)
    # infos that fit the layout are never all empty (a layout has keys): try it first
    if slot.layout is not None and slot.write_columns(infos):
        fast.answer(conn, DONE_COLUMNS)
    elif all(len(env_infos) == 1 and not env_infos[0] for env_infos in infos):
        fast.answer(conn, DONE_EMPTY)
    else:
        layout = InfoLayout.learn(infos)
        if layout is not None and layout != slot.layout:
            slot.layout = layout  # the caller takes it from this answer
        else:
            layout = None
        locate = step_locator(envs, request, None, infos)
        fast.answer(conn, pickle_answer((FAST_INFOS, infos, layout), locate))


def _readable_waiter(fd: int) -> Callable[..., Any]:
    """A wait until ``fd`` (the worker's end of its socket pair) is readable or hung up,
    for the serve loop to sleep in before each read: ``wait(timeout_ms=None)`` returns
    what is ready (empty: the timeout passed).

    Sleeping in ``poll`` for input instead of in ``read``: the caller's read of every
    answer frees socket buffer space, and the kernel then wakes whoever sleeps on this
    end's queue; a sleeper in ``read`` wakes for nothing (and the caller pays for the
    wake-up), one in ``poll`` for input only is not woken by it (Linux filters poll
    wake-ups by event).
    """
    if not hasattr(select, "poll"):  # pragma: no cover - platforms without poll()
        return lambda timeout=None: [fd]
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return poller.poll


def _serve(envs: WorkerEnvs, conn: Connection, parent_pid: int) -> None:
    threading.Thread(target=watch_parent, args=(parent_pid,), daemon=True).start()
    fast = _FastPath()
    steps = EnvSteps(envs, fast, conn)
    try:
        _serve_loop(envs, conn, fast, steps)
    finally:
        steps.drain()
        fast.release()


def _serve_loop(envs: WorkerEnvs, conn: Connection, fast: _FastPath, steps: EnvSteps) -> None:
    fd = fast.fd = conn.fileno()
    readable = _readable_waiter(fd)
    while True:
        data = fast.next_frame(readable)  # EOFError: the caller is gone
        fast.received_one()
        if len(data) == 1:  # a fast step: its request is in the slot
            steps.drain()
            _fast_step(envs, fast, conn, timed=data == WAKE_STEP_TIMED)
            fast.note_mode(envs)
            continue
        message = pickle.loads(data)
        command, payload = message[0], message[1]
        timed = len(message) > 2  # profiling: start and finish times ride on the answer
        if command == Command.STEP_ENV:  # started now, answered when done
            steps.start(payload, timed)
            fast.note_mode(envs)
            continue
        steps.drain()  # every other command in order, after the env steps before it
        if command == Command.ATTACH_SLOT:
            fast.attach(*payload)
            fast.note_mode(envs)
            continue
        started = time.monotonic_ns() if timed else 0
        answer = serve_command(envs, command, payload)
        if command == Command.STEP:
            fast.note_mode(envs)
        if answer is None:
            continue
        if timed and isinstance(answer, Ok):
            answer.times = (started, time.monotonic_ns())
        # a result that cannot be pickled becomes its Raised (nothing was written yet)
        fast.answer(
            conn, pickle_answer(to_wire(answer), answer_locator(envs, command, payload, answer))
        )
        if command == Command.CLOSE:  # the worker ends whatever its envs' close did
            return
