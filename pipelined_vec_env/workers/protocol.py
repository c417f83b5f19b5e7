"""The worker protocol's vocabulary: the commands a worker serves and its typed answers.

Shared by the worker process ([`pipelined_vec_env.workers.worker`][pipelined_vec_env.workers.worker]), the
Ray actor (`pipelined_vec_env.workers.ray_backend`) and the
caller's side ([`pipelined_vec_env.workers.pool`][pipelined_vec_env.workers.pool], the stages and decoupled
stepping). A command travels as ``(Command, payload)``, or ``(Command, payload, True)``
when the caller profiles and wants the worker's start and finish times back. Every command
but `Command.ATTACH`, `Command.SET_AUTORESET` and `Command.ATTACH_SLOT` gets exactly one answer:

| answer | when | carries |
|---|---|---|
| `Ready` | a worker built its envs (start-up) | its envs' spaces, metadata, render mode, spec |
| `Ok` | a command succeeded | the command's result (and the worker's times) |
| `Raised` | an env (or pickling the result) raised | exception type, message, traceback |
| `Crashed` | the caller found the worker dead | its exit code (None: unknown, e.g. Ray) |
| `TimedOut` | a worker did not start in `start_timeout` | the message to raise |

`Crashed` and `TimedOut` never travel on the wire: the caller's side makes them. On the
subprocess pipe an answer travels as a small tuple with an int tag (`to_wire`, decoded
by `from_wire`). Measured for a one-env step answer (`timeit`, pickle protocol 5, a
loaded 2-core machine): the string-tagged tuple this replaces 51 bytes, 0.54 us to pickle
and 0.67 us to unpickle; pickling the `Ok` object itself (a class reference) 85 bytes,
2.19 / 2.28 us; `to_wire` / `from_wire` 48 bytes, 1.02 / 1.17 us (building the objects
included). Ray actors return the answer objects as they are.
"""

from __future__ import annotations

import pickle
import traceback
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple

__all__ = [
    "NO_ANSWER",
    "Answer",
    "Command",
    "Crashed",
    "Ok",
    "Raised",
    "Ready",
    "StepRequest",
    "TimedOut",
    "from_wire",
    "tag_wire",
    "to_wire",
    "untag_wire",
]


class Command(StrEnum):
    """What a worker is asked to do (a `str` subclass: compares equal to its value).

    | command | payload | `Ok` payload |
    |---|---|---|
    | `ATTACH` | `(observation_space, buffers, num_envs, generations)` (generations: further buffers a step may name, `observation_ring`) | no answer |
    | `RESET` | `[(local_index, seed, options), ...]` | `(obs_items, infos)` |
    | `STEP` | `StepRequest` | `(obs_items, rewards, terminations, truncations, infos)` |
    | `STEP_ENV` | `(local_index, batched actions of that one env)` | as `STEP`'s, for the one env; answered as soon as that env stepped, maybe before commands sent earlier (tagged, see `tag_wire`) |
    | `CALL` | `(name or fn, args, kwargs, local_indices)` | tuple of per-env results |
    | `SET_ATTR` | `(name, values, local_indices)` | `None` |
    | `SET_AUTORESET` | local indices (their next step resets) | no answer |
    | `ATTACH_SLOT` | `(slots.StepSlot, spin)`: the step fast path's slot (spin: whether the worker may spin for its next message, see `WorkerHandle.worker_spin`) | no answer |
    | `CLOSE` | `None` | `None`, then the worker exits |

    `START` is never sent: it names a worker's start-up in the pool's queue of commands
    in flight (answered by `Ready`).
    """

    START = "start"
    ATTACH = "attach"
    RESET = "reset"
    STEP = "step"
    STEP_ENV = "step_env"
    CALL = "call"
    SET_ATTR = "set_attr"
    SET_AUTORESET = "set_autoreset"
    ATTACH_SLOT = "attach_slot"
    CLOSE = "close"


class StepRequest(NamedTuple):
    """The payload of a `Command.STEP` (pickled, or written into the fast path's slot)."""

    local_indices: list[int] | None
    """The worker's envs to step, by local index (None: all of them, in order)."""
    actions: Any
    """Their batched actions, one row per env stepped."""
    generation: int = 0
    """The generation of the observation buffers to write (0: the first buffers;
    `observation_ring`)."""


#: Commands a worker does not answer.
NO_ANSWER = frozenset({Command.ATTACH, Command.SET_AUTORESET, Command.ATTACH_SLOT})


class Ok:
    """A command succeeded.

    Attributes:
        payload: The command's result (see `Command`).
        times: ``(started_ns, finished_ns)`` in the worker (``time.monotonic_ns``) when the
            command asked for them (profiling), else None.
    """

    __slots__ = ("payload", "times")
    kind: ClassVar[str] = "ok"
    ok: ClassVar[bool] = True

    def __init__(self, payload: Any = None, times: tuple[int, int] | None = None) -> None:
        self.payload = payload
        self.times = times

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Ok, (self.payload, self.times)

    def __repr__(self) -> str:
        return f"Ok({self.payload!r})"


class Ready:
    """A worker started and built its envs.

    Attributes:
        description: ``{"observation_spaces", "action_spaces", "metadata", "render_mode",
            "spec"}`` of its envs.
    """

    __slots__ = ("description",)
    kind: ClassVar[str] = "ready"
    ok: ClassVar[bool] = True

    def __init__(self, description: dict[str, Any]) -> None:
        self.description = description

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Ready, (self.description,)

    def __repr__(self) -> str:
        return "Ready(...)"


class Raised:
    """The worker's code raised; enough to re-raise it in the caller.

    Attributes:
        pickled: The pickled exception, or None when it does not survive a pickle round
            trip (checked in the worker).
        type_name: ``module.QualifiedName`` of its type.
        message: ``str(exc)``.
        traceback: The worker's formatted traceback.
    """

    __slots__ = ("message", "pickled", "traceback", "type_name")
    kind: ClassVar[str] = "error"
    ok: ClassVar[bool] = False

    def __init__(self, pickled: bytes | None, type_name: str, message: str, traceback: str) -> None:
        self.pickled = pickled
        self.type_name = type_name
        self.message = message
        self.traceback = traceback

    @classmethod
    def from_exception(cls, exc: BaseException) -> Raised:
        """Describe ``exc`` (in the worker) so that the caller can re-raise it."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            data: bytes | None = pickle.dumps(exc)
            pickle.loads(data)
        except Exception:
            data = None
        name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        try:
            message = str(exc)
        except Exception:
            message = "<str() failed>"
        return cls(data, name, message, tb)

    def exception(self) -> BaseException | None:
        """The original exception rebuilt, or None when it cannot be."""
        if self.pickled is None:
            return None
        try:
            return pickle.loads(self.pickled)
        except Exception:
            return None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Raised, (self.pickled, self.type_name, self.message, self.traceback)

    def __repr__(self) -> str:
        return f"Raised({self.type_name}: {self.message})"


class Crashed:
    """The worker was found dead (made by the caller's side, never sent).

    Attributes:
        exitcode: The process's exit code (negative: killed by that signal), or None when
            unknown (a Ray actor).
    """

    __slots__ = ("exitcode",)
    kind: ClassVar[str] = "crashed"
    ok: ClassVar[bool] = False

    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode

    def __repr__(self) -> str:
        return f"Crashed(exitcode={self.exitcode})"


class TimedOut:
    """The worker did not start within ``start_timeout`` and was killed (caller's side).

    Attributes:
        message: What to raise (as `WaitTimeoutError`).
    """

    __slots__ = ("message",)
    kind: ClassVar[str] = "timed_out"
    ok: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"TimedOut({self.message!r})"


#: Any answer of the protocol.
Answer = Ok | Ready | Raised | Crashed | TimedOut


_OK, _READY, _RAISED, _TAGGED = 0, 1, 2, 3


def to_wire(answer: Ok | Ready | Raised) -> tuple[Any, ...]:
    """The compact tuple that carries ``answer`` through a pipe (see `from_wire`)."""
    if isinstance(answer, Ok):
        if answer.times is None:
            return (_OK, answer.payload)
        return (_OK, answer.payload, answer.times)
    if isinstance(answer, Ready):
        return (_READY, answer.description)
    return (_RAISED, answer.pickled, answer.type_name, answer.message, answer.traceback)


def from_wire(message: tuple[Any, ...]) -> Ok | Ready | Raised:
    """The answer that `to_wire` encoded as ``message``.

    Raises:
        ValueError: Not an encoded answer.
    """
    tag = message[0]
    if tag == _OK:
        return Ok(message[1], message[2] if len(message) > 2 else None)
    if tag == _READY:
        return Ready(message[1])
    if tag == _RAISED:
        return Raised(*message[1:])
    raise ValueError(f"not a protocol answer: tag {tag!r}")


def tag_wire(tag: int, data: bytes) -> tuple[int, int, bytes]:
    """The message that carries ``data`` (a pickled `to_wire` answer) tagged with ``tag``:
    the local index of the env whose `Command.STEP_ENV` it answers (such answers may come
    out of order; `untag_wire` reads them)."""
    return (_TAGGED, tag, data)


def untag_wire(message: tuple[Any, ...]) -> tuple[tuple[Any, ...], int | None]:
    """``(the answer's wire tuple, its tag)`` for a message `tag_wire` made; ``(message,
    None)`` for any other."""
    if message[0] != _TAGGED:
        return message, None
    return pickle.loads(message[2]), message[1]
