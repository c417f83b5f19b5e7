"""The step fast path's shared-memory slot: one per subprocess worker.

A `StepSlot` is one named shared-memory segment (a
[`SharedArray`][pipelined_vec_env.shared_memory.SharedArray]) that holds, for the
worker's ``n`` envs:

| field | dtype, shape | written by |
|---|---|---|
| header | ``int64[9]``: messages sent, answers sent, envs in the request, worker times, the message the worker spins for, the last message sent without a pipe frame and its kind, whether the worker steps its envs concurrently | both |
| env indices | ``int64[n]``: the local envs of a partial step | caller |
| actions | the action space's dtype, ``(n, *shape)`` | caller |
| rewards | ``float64[n]`` | worker |
| terminations, truncations | ``bool[n]`` each | worker |
| info cells | ``int64[MAX_INFO_COLUMNS, n]``: one scalar info key per row | worker |

A fast ``step`` writes the actions into the slot and sends one short message
(`WAKE_STEP`) through the worker's pipe; the worker steps, writes the results into the
slot and answers with one short message (`DONE_EMPTY`: every info empty, or `DONE_COLUMNS`:
the infos are in the info cells under the worker's current `InfoLayout`), or, when the
infos do not fit the layout, a pickled ``(FAST_INFOS, infos, layout)`` message. The
pipe stays the wake-up and the end-of-process signal, so the caller's wait on pipe and
process sentinel notices a dead worker as before. See docs/wire_format.md.

The header's two counters let either side spin on the slot instead of sleeping in the
kernel: the caller bumps ``sent`` after every message it writes to the pipe, the worker
bumps ``answered`` after every answer. A spinner that sees the counter move reads the
message from the pipe, where it already is (the write, a system call, came first), so it
never blocks in that read, and a sleeper is woken by the write itself: no wake-up is lost.

A worker that spins for its next message says so in the header (``waiting``: the number
of the message it spins for). A fast step sent while it does skips the pipe: the caller
writes the wake-up's kind and its number (``wakeless``) into the header, then bumps
``sent``; the worker, seeing ``sent`` move, finds the message there instead of in the
pipe. A caller that read ``waiting`` just before the spin ended bumps ``sent`` into a
worker that stopped spinning: so a worker that spun never sleeps without a timeout until
its next message (its serve loop), and such a step waits at most that timeout.

The info cells' encoding (`InfoLayout`, `ColumnInfos`) is
[`info_columns`][pipelined_vec_env.workers.info_columns]'s, its names importable from here
too.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np
from gymnasium import spaces

from ..shared_memory import SharedArray
from .info_columns import (
    CELL_TYPES,
    MAX_INFO_COLUMNS,
    ColumnInfos,
    InfoLayout,
    all_true,
    batched_infos,
    join_column_infos,
)
from .protocol import StepRequest

__all__ = [
    "DONE_COLUMNS",
    "DONE_EMPTY",
    "FAST_INFOS",
    "MAX_INFO_COLUMNS",
    "WAKE_STEP",
    "WAKE_STEP_TIMED",
    "ColumnInfos",
    "InfoLayout",
    "SlotRead",
    "StepSlot",
    "all_true",
    "join_column_infos",
    "read_step",
    "recv_frame",
    "send_short",
]

#: Caller -> worker: step the envs the slot's request names (one byte through the pipe).
WAKE_STEP = b"\x01"
#: As `WAKE_STEP`, and write the worker's start and finish times into the header.
WAKE_STEP_TIMED = b"\x02"
#: Worker -> caller: results are in the slot, every env's info is empty.
DONE_EMPTY = b"\x00"
#: Worker -> caller: results are in the slot, infos are in the info cells.
DONE_COLUMNS = b"\x01"
#: Tag of a pickled fast answer ``(FAST_INFOS, infos, layout or None)`` (results in the slot).
FAST_INFOS = 100
_SHORT_FRAMES = {
    byte: struct.pack("!i", 1) + byte for byte in (WAKE_STEP, WAKE_STEP_TIMED, DONE_EMPTY)
}
# a whole one-byte frame, as one read returns it -> its byte
_SHORT_BODIES = {frame: byte for byte, frame in _SHORT_FRAMES.items()}
(
    _SENT,
    _ANSWERED,
    _COUNT,
    _STARTED,
    _FINISHED,
    _WAITING,
    _WAKELESS,
    _KIND,
    _CONCURRENT,
    _GENERATION,
) = range(10)
_HEADER = 10
_KINDS = {WAKE_STEP: 1, WAKE_STEP_TIMED: 2}
_KIND_BYTES = {code: byte for byte, code in _KINDS.items()}


def send_short(fd: int, message: bytes) -> None:
    """Write the one-byte ``message`` to the pipe ``fd`` as one ``Connection`` frame (a
    4-byte big-endian length, then the byte), in one ``write`` (atomic: under
    ``PIPE_BUF``). The same bytes as ``Connection.send_bytes``, without its Python layers.

    Raises:
        OSError (BrokenPipeError ...): The other end is gone.
    """
    os.write(fd, _SHORT_FRAMES[message])


def recv_frame(fd: int) -> bytes:
    """Read one ``Connection`` frame from the pipe ``fd`` and return its bytes (blocks).

    One ``read`` for a one-byte frame (the fast path's wake-ups and answers), two for
    longer ones: it reads the 4-byte length and up to one byte of the body at once, which
    never reads past the frame because no frame of this protocol is empty. Frames stay
    `Connection.recv_bytes`-compatible (both may read the same pipe).

    Raises:
        EOFError: The other end closed the pipe.
    """
    data = os.read(fd, 5)
    short = _SHORT_BODIES.get(data)
    if short is not None:  # the fast path's frames: the length says 1, the byte is here
        return short
    while 0 < len(data) < 4:
        more = os.read(fd, 4 - len(data))
        if not more:
            break
        data += more
    if len(data) < 4:
        raise EOFError("the pipe was closed")
    (size,) = struct.unpack("!i", data[:4])
    body = data[4:]
    if size == -1:  # a frame over 2 GiB: an 8-byte length follows
        header = body + _read_exactly(fd, 8 - len(body))
        (size,) = struct.unpack("!Q", header)
        body = b""
    if size == len(body):
        return body
    return body + _read_exactly(fd, size - len(body))


def _read_exactly(fd: int, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the pipe was closed mid-message")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _fixed_layout(space: spaces.Space) -> bool:
    return isinstance(
        space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
    )


class SlotRead:
    """A fast step's answer while its results are still in the worker's slot (the
    payload of its `Ok`): `read` copies them out as `StepSlot.read_results` does, or
    `read_step` joins the answers of a whole step straight from the slots.

    The slot is written again at the worker's next step: the worker handle calls `keep`
    before it sends one, which copies the results out unless they were used already.

    Attributes:
        slot: The worker's slot.
        count: How many envs the step was for (the slot's first ``count`` rows).
        message: The answer's message (`DONE_EMPTY`, `DONE_COLUMNS` or the pickled
            ``(FAST_INFOS, infos, layout)`` tuple).
    """

    __slots__ = ("_copy", "count", "message", "slot", "used")

    def __init__(self, slot: StepSlot, count: int, message: bytes | tuple) -> None:
        self.slot, self.count, self.message = slot, count, message
        self._copy: tuple[Any, ...] | None = None
        self.used = False  # read straight from the slot by `read_step`

    def read(self) -> tuple[Any, ...]:
        """The payload ``(None, rewards, terminations, truncations, infos)`` (copies, made
        once)."""
        if self._copy is None:
            self._copy = self.slot.read_results(self.count, self.message)
        return self._copy

    def in_slot(self) -> bool:
        """Whether the results are only in the slot (neither copied out nor used)."""
        return self._copy is None and not self.used

    def keep(self) -> None:
        """Copy the results out before the slot is written again, unless already used."""
        if not self.used:
            self.read()


def read_step(
    reads: list[SlotRead], num_envs: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]] | None:
    """``(rewards, terminations, truncations, infos)`` of ``num_envs`` envs from the
    answers ``reads`` (each `SlotRead.in_slot`, for all its slot's envs, in env order,
    covering the ``num_envs``), joined from the slots: one copy per array, infos batched
    as gymnasium does. None (nothing read) unless every answer's infos are empty, or every
    one is in the info cells under one layout of one cell kind; `SlotRead.read` then
    serves them one by one.
    """
    message = reads[0].message
    if type(message) is not bytes:
        return None  # a pickled message
    slots = []
    for r in reads:
        if r.message != message:  # several kinds (bytes never equal a pickled tuple)
            return None
        slots.append(r.slot)
    if message == DONE_EMPTY:
        infos: dict[str, Any] = {}
    elif message == DONE_COLUMNS:
        layout = slots[0].layout
        if layout is None or layout.cell_dtype is None:
            return None
        for s in slots:
            if s.layout is not layout and s.layout != layout:
                return None
        k = len(layout.keys)
        values = np.concatenate([s.cells[:k] for s in slots], axis=1).view(layout.cell_dtype)
        infos = batched_infos(layout, values, all_true((k, num_envs)))
    else:
        return None
    rewards = np.concatenate([s.rewards for s in slots])
    terminations = np.concatenate([s.terminations for s in slots])
    truncations = np.concatenate([s.truncations for s in slots])
    for r in reads:
        r.used = True
    return rewards, terminations, truncations, infos


def _aligned(offset: int, align: int = 8) -> int:
    return -(-offset // align) * align


class StepSlot:
    """The shared-memory slot of one worker's ``n`` envs (see the module docstring).

    Pickles by segment name: the worker attaches to the caller's segment.

    Args:
        action_space: The envs' single action space (Box, Discrete, MultiDiscrete or
            MultiBinary).
        n: The worker's number of envs.
        array: Attach to this segment instead of creating one.

    Raises:
        TypeError: An action space without a fixed array layout.
    """

    def __init__(self, action_space: spaces.Space, n: int, array: SharedArray | None = None):
        if not _fixed_layout(action_space):
            raise TypeError(f"no slot layout for the action space {action_space}")
        self.action_space = action_space
        self.n = n
        self.action_dtype = np.dtype(action_space.dtype)
        shape = (n, *action_space.shape)
        offsets = {}
        size = 0
        for name, nbytes in (
            ("header", 8 * _HEADER),
            ("indices", 8 * n),
            ("actions", int(np.prod(shape, dtype=np.int64)) * self.action_dtype.itemsize),
            ("rewards", 8 * n),
            ("terminations", n),
            ("truncations", n),
            ("cells", 8 * MAX_INFO_COLUMNS * n),
        ):
            size = _aligned(size)
            offsets[name] = size
            size += nbytes
        self.array = array if array is not None else SharedArray(size)
        buf = self.array.get_obj()

        def view(name: str, dtype: Any, view_shape: tuple[int, ...]) -> np.ndarray:
            count = int(np.prod(view_shape, dtype=np.int64))
            return np.frombuffer(buf, dtype=dtype, count=count, offset=offsets[name]).reshape(
                view_shape
            )

        self.header = view("header", np.int64, (_HEADER,))
        self.indices = view("indices", np.int64, (n,))
        self.actions = view("actions", self.action_dtype, shape)
        self.rewards = view("rewards", np.float64, (n,))
        self.terminations = view("terminations", np.bool_, (n,))
        self.truncations = view("truncations", np.bool_, (n,))
        self.cells = view("cells", np.int64, (MAX_INFO_COLUMNS, n))
        self.float_cells = self.cells.view(np.float64)
        self._batch_shape = shape  # the actions of a step of all n envs
        # each side's own counter, mirrored into the header (one store, no read back)
        self._sent = int(self.header[_SENT])
        self._answered = int(self.header[_ANSWERED])
        #: The info layout both sides use for `DONE_COLUMNS` answers (each side sets its
        #: own copy: the worker when it learns one, the caller from the answer that names it).
        self.layout: InfoLayout | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return StepSlot, (self.action_space, self.n, self.array)

    def release(self) -> None:
        """Drop the views and unmap the segment (removing it in the process that made it)."""
        for name in (
            "header",
            "indices",
            "actions",
            "rewards",
            "terminations",
            "truncations",
            "cells",
            "float_cells",
        ):
            setattr(self, name, None)
        self.array.release()

    # ------------------------------------------------------------------ caller side

    def accepts(self, actions: Any, count: int) -> bool:
        """Whether ``actions`` (the batch for ``count`` envs) fits the slot exactly: a
        numpy array of the slot's dtype and shape (anything else goes pickled, so the
        env gets exactly what the caller passed)."""
        if type(actions) is not np.ndarray or actions.dtype != self.action_dtype:
            return False
        if count == self.n:
            return actions.shape == self._batch_shape
        return actions.shape == (count, *self._batch_shape[1:])

    def write_request(
        self, local_indices: list[int] | None, actions: np.ndarray, generation: int = 0
    ) -> None:
        """Write a step request (``local_indices`` None: all ``n`` envs; ``generation``: of
        the observation buffers to write, `observation_ring`)."""
        self.header[_GENERATION] = generation
        count = len(actions)
        if local_indices is None:
            self.header[_COUNT] = -1
        else:
            self.header[_COUNT] = count
            self.indices[:count] = local_indices
        self.actions[:count] = actions

    def note_sent(self) -> None:
        """Count one message written to the worker's pipe (after writing it)."""
        self._sent += 1
        self.header[_SENT] = self._sent

    def worker_spins_for_next(self) -> bool:
        """Whether the worker spins on the slot for the next message now (it then sees
        one sent with `note_sent_wakeless` without a pipe frame)."""
        return int(self.header[_WAITING]) == self._sent + 1

    def note_sent_wakeless(self, message: bytes) -> None:
        """Send the one-byte wake-up ``message`` (`WAKE_STEP` or `WAKE_STEP_TIMED`)
        through the header alone, for a worker that `worker_spins_for_next`: its kind
        and number first, then the count the worker watches (x86-64 keeps the stores in
        this order as the worker sees them)."""
        number = self._sent + 1
        self.header[_KIND] = _KINDS[message]
        self.header[_WAKELESS] = number
        self._sent = number
        self.header[_SENT] = number

    def answers_sent(self) -> int:
        """How many answers the worker has written to the pipe."""
        return int(self.header[_ANSWERED])

    def read_results(self, count: int, message: bytes | tuple) -> tuple[Any, ...]:
        """The `Ok` payload of a fast step answer for ``count`` envs (copied out of the
        slot), given the answer's pipe message: ``(None, rewards, terminations,
        truncations, infos)`` as the pickled path's, with float64/bool arrays."""
        if count == self.n:
            rewards = self.rewards.copy()
            terminations = self.terminations.copy()
            truncations = self.truncations.copy()
        else:
            rewards = self.rewards[:count].copy()
            terminations = self.terminations[:count].copy()
            truncations = self.truncations[:count].copy()
        if isinstance(message, tuple):  # (FAST_INFOS, infos, layout)
            infos: Any = message[1]
        elif message == DONE_COLUMNS:
            infos = self._read_columns(count)
        else:
            infos = ColumnInfos(None, [], count)
        return None, rewards, terminations, truncations, infos

    def times(self) -> tuple[int, int]:
        """The worker's start and finish times of the last timed fast step (ns)."""
        return int(self.header[_STARTED]), int(self.header[_FINISHED])

    def _read_columns(self, count: int) -> ColumnInfos:
        layout = self.layout
        assert layout is not None, "a column answer before any layout"
        # one copy of the used cells; each column a view of it as float64 or int64 (cast
        # to the key's dtype where it is merged or read)
        block = self.cells[: len(layout.keys), :count].copy()
        if layout.cell_dtype is not None:  # one kind of cell: the columns are its rows
            return ColumnInfos(layout, None, count, block.view(layout.cell_dtype))
        float_block = block.view(np.float64)
        values = [
            float_block[c] if is_float else block[c] for c, is_float in enumerate(layout.floats)
        ]
        return ColumnInfos(layout, values, count)

    # ------------------------------------------------------------------ worker side

    def read_request(self) -> StepRequest:
        """The request (actions copied out)."""
        count, generation = int(self.header[_COUNT]), int(self.header[_GENERATION])
        if count < 0:
            return StepRequest(None, self.actions.copy(), generation)
        return StepRequest(self.indices[:count].tolist(), self.actions[:count].copy(), generation)

    def messages_sent(self) -> int:
        """How many messages the caller has sent (through the pipe or the header)."""
        return int(self.header[_SENT])

    def spin_for(self, number: int) -> None:
        """Say that the worker spins for message ``number`` now (0: it stopped)."""
        self.header[_WAITING] = number

    def wakeless(self, number: int) -> bytes | None:
        """The wake-up byte of message ``number`` if it came through the header alone
        (`note_sent_wakeless`), else None (it is in the pipe, or not sent yet)."""
        if int(self.header[_WAKELESS]) != number:
            return None
        return _KIND_BYTES[int(self.header[_KIND])]

    def write_results(
        self, rewards: np.ndarray, terminations: np.ndarray, truncations: np.ndarray
    ) -> None:
        """Write a step's rewards and flags (the first ``len(rewards)`` rows)."""
        count = len(rewards)
        self.rewards[:count] = rewards
        self.terminations[:count] = terminations
        self.truncations[:count] = truncations

    def write_columns(self, infos: list[list[dict]]) -> bool:
        """Write ``infos`` into the info cells under `layout`; False when they do not fit
        it (nothing to trust in the cells then)."""
        layout = self.layout
        if layout is None:
            return False
        rows = layout.rows(infos)
        if rows is None:
            return False
        if layout.cell_dtype is not None:  # one kind of cell: one 2-D store of every value
            cells = self.float_cells if layout.floats[0] else self.cells
            try:
                cells[: len(layout.keys), : len(infos)].T[:] = rows
            except OverflowError:  # an int beyond int64
                return False
            return True
        for c, t in enumerate(layout.types):
            cells = self.float_cells if CELL_TYPES[t] == "f" else self.cells
            try:
                cells[c, : len(infos)] = [row[c] for row in rows]
            except OverflowError:  # an int beyond int64
                return False
        return True

    def write_times(self, started: int, finished: int) -> None:
        """Record the worker's start and finish times of a timed step (ns)."""
        self.header[_STARTED], self.header[_FINISHED] = started, finished

    def set_concurrent(self, concurrent: bool) -> None:
        """Worker: say whether it steps its envs concurrently (`step_profile`), so that
        decoupled stepping sends it one `Command.STEP_ENV` per env (no extra message)."""
        self.header[_CONCURRENT] = int(concurrent)

    def worker_concurrent(self) -> bool:
        """Caller: whether the worker said it steps its envs concurrently."""
        return bool(self.header[_CONCURRENT])

    def note_answered(self) -> None:
        """Count one answer written to the pipe (after writing it)."""
        self._answered += 1
        self.header[_ANSWERED] = self._answered
