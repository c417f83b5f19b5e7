"""The wire of one worker, as `WorkerPool` uses it: the small interface a backend implements.

Two implementations today: `worker_handle.WorkerHandle` (a subprocess and a pickled duplex
pipe; the pipe's reads and the process sentinel are watched together, so a dead worker is
noticed at once) and `ray_backend.RayWorkerHandle` (a Ray actor; each command is an actor
call whose ``ObjectRef`` is the answer). Waiting on several workers at once goes through
`worker_handle.receive_ready` / `find_dead` / `close_all`, which pick
the backend's own wait (``select.poll`` or ``ray.wait``). The fast-path issue replaces
the pipe with shared-memory slots behind this same interface.
"""

from __future__ import annotations

from typing import Any, Protocol

from .protocol import Answer, Command

__all__ = ["WorkerTransport"]


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

    @property
    def exitcode(self) -> int | None: ...

    def send(self, command: Command, payload: Any, expect_answer: bool = True) -> None:
        """Send one command (a dead worker's answer becomes `Crashed` at once)."""

    def take(self) -> Answer:
        """Return and clear the received answer."""

    def restart(self, counted: bool = True) -> None:
        """Kill the worker and start a fresh one for the same envs (it answers `Ready`)."""

    def kill_for_deadline(self) -> None:
        """Kill a worker that overran its deadline; its wait then reads a crash."""

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker (politely within ``timeout`` s, then by force). Always returns."""
