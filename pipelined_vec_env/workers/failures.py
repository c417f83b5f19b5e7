"""What a failed answer means to the caller: a short reason, or the exception to raise.

Shared by stage stepping (`stages.py`), decoupled stepping (`decoupled.py`) and the pool's
start-up (`pool.py`), whatever the backend: a handle is read only through its public
`transport.WorkerTransport` attributes.
"""

from __future__ import annotations

from typing import Any

from ..errors import RemoteTraceback, WaitTimeoutError, WorkerCrashedError, WorkerError
from .protocol import Answer, Crashed, Raised, TimedOut

__all__ = ["describe_failure", "raise_worker_error"]


def describe_failure(handle: Any, answer: Answer) -> str:
    """A short reason for a failed answer, for `StageFailedError` messages."""
    who = f"worker {handle.index} (envs {list(handle.env_indices)})"
    if isinstance(answer, Crashed):
        return f"{who} died"
    if isinstance(answer, TimedOut):
        return f"{who} did not start in time"
    assert isinstance(answer, Raised), answer
    return f"{who} raised {answer.type_name}"


def raise_worker_error(handle: Any, answer: Answer) -> None:
    """Re-raise a worker's failure in the caller.

    The worker's exception comes back with its original type and the worker traceback as
    ``__cause__`` (as `concurrent.futures` does); one that cannot be rebuilt becomes
    [`WorkerError`][pipelined_vec_env.errors.WorkerError]; a dead worker becomes
    [`WorkerCrashedError`][pipelined_vec_env.errors.WorkerCrashedError]; a worker that did
    not start within ``start_timeout`` becomes
    [`WaitTimeoutError`][pipelined_vec_env.errors.WaitTimeoutError].
    """
    if isinstance(answer, Crashed):
        detail = "killed for overrunning step_deadline" if handle.deadline_exceeded else ""
        raise WorkerCrashedError(
            handle.index, handle.env_indices, answer.exitcode, detail, handle.stacks
        )
    if isinstance(answer, TimedOut):
        raise WaitTimeoutError(answer.message)
    assert isinstance(answer, Raised), answer
    exc = answer.exception()
    if exc is None:
        raise WorkerError(answer.type_name, answer.message, answer.traceback, handle.index)
    raise exc from RemoteTraceback(answer.traceback)
