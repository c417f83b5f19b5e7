"""The wire of the workers, as `WorkerPool` uses it: the small interface a backend implements.

A backend gives two things: a handle per worker (`WorkerTransport`: send a command, take
its answer, restart, kill, close) and the waits on several workers at once
(`WorkerBackend`: receive what is ready, find workers that died while idle, close them
all). Two backends today:

| backend | one worker | many workers |
|---|---|---|
| multiprocessing | `worker_handle.WorkerHandle`: a subprocess and a duplex pipe; steps through a shared-memory `slots.StepSlot` on the fast path (the pipe carries a one-byte wake-up, see docs/wire_format.md) | `process_backend.ProcessBackend`: one ``select.poll`` on the pipes and process sentinels, after a bounded spin on the slots where a core is free |
| Ray | `ray_backend.RayWorkerHandle`: a Ray actor, one actor call per command | `ray_backend.RayBackend`: ``ray.wait`` on the oldest outstanding ``ObjectRef`` of each |

The pool picks the backend once, when it starts the workers, and calls only these two
interfaces: nothing outside a backend reads a handle's process, pipe or actor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .protocol import Answer, Command

__all__ = ["WorkerBackend", "WorkerTransport"]


class WorkerTransport(Protocol):
    """One worker's end of the wire, seen from the caller.

    Attributes:
        index: Worker index (global, across stages).
        stage: The stage it belongs to.
        env_indices: Global indices of its envs.
        restarts: Counted restarts so far (the ``max_restarts`` budget).
        pending: Answers are expected and not all received yet (several commands may be
            in flight: decoupled stepping queues them).
        answer: The oldest received answer, until `take` (None: none); the next one is
            read only after it was taken.
        dead: The worker was found dead.
        deadline_exceeded: It was killed for overrunning its deadline.
        stacks: Every thread's Python stack dumped just before that kill, or None (always
            None with Ray).
        exitcode: Its exit code once dead (None: alive, or unknown as with Ray).
    """

    index: int
    stage: int
    env_indices: tuple[int, ...]
    restarts: int
    pending: bool
    answer: Answer | None
    dead: bool
    deadline_exceeded: bool
    stacks: str | None

    @property
    def exitcode(self) -> int | None: ...

    @property
    def pid(self) -> int | None:
        """The worker's process id (on its node for Ray; None if it cannot be told)."""

    def send(self, command: Command, payload: Any, expect_answer: bool = True) -> None:
        """Send one command (a dead worker's answer becomes `Crashed` at once)."""

    def take(self) -> Answer:
        """Return and clear the received answer."""

    def restart(self, counted: bool = True) -> None:
        """Kill the worker and start a fresh one for the same envs (it answers `Ready`)."""

    def dump_stacks(self, timeout: float = 1.0) -> str | None:
        """Every thread's Python stack in the live worker, or None where not available."""

    def kill_for_deadline(self) -> None:
        """Kill a worker that overran its deadline; its wait then reads a crash."""

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker (politely within ``timeout`` s, then by force). Always returns."""


class WorkerBackend(Protocol):
    """The waits of one backend on several of its workers at once."""

    def receive_ready(
        self, handles: Sequence[Any], timeout: float | None, wake_fd: int | None = None
    ) -> bool:
        """Wait until at least one pending handle of ``handles`` has an answer or is found
        dead, ``wake_fd`` (a descriptor, not read) is readable, or ``timeout`` seconds
        (None: no limit) pass; store each ready answer in its handle's ``answer``.

        Returns:
            Whether ``wake_fd`` was readable (False when it is None).
        """

    def none_written(self, handles: Sequence[Any]) -> bool:
        """Whether shared memory tells, without a system call, that none of ``handles``
        has an answer to read, a received answer not taken, or a known death (a backend
        that cannot tell returns False)."""

    def spin_for_answers(self, handles: Sequence[Any], seconds: float) -> None:
        """Spin, yielding the core, until one of ``handles`` has an answer ready to read
        without blocking, at most ``seconds`` (a backend that cannot tell returns at
        once). Nothing is read: `receive_ready` reads it."""

    def find_dead(self, handles: Sequence[Any], timeout: float = 10.0) -> None:
        """Mark dead (``dead = True``) those of ``handles`` that died while idle, asking
        at most ``timeout`` seconds."""

    def close_all(self, handles: Sequence[Any], timeout: float) -> None:
        """Stop every worker of ``handles`` in parallel (``timeout`` seconds in all for the
        polite part, 0: at once). Always returns."""
