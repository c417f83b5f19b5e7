"""Errors raised by [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv].

Worker exceptions are re-raised in the caller with their original type and the worker's
formatted traceback attached as ``__cause__`` (the convention of
`concurrent.futures`). These classes cover what cannot be expressed that way.
"""

from __future__ import annotations

import multiprocessing
import signal
from typing import Any

from .stacks import innermost_frames

__all__ = [
    "ObservationError",
    "RemoteTraceback",
    "StageFailedError",
    "WaitTimeoutError",
    "WorkerCrashedError",
    "WorkerError",
    "describe_exit",
]


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised inside a worker process.

    Attached as ``__cause__`` of the re-raised exception so that the traceback printed in
    the caller shows where the worker failed.

    Args:
        tb: The traceback text as formatted in the worker.
    """

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n\nTraceback in the worker process:\n"""\n{self.tb}"""'


class WorkerError(RuntimeError):
    """An exception from a worker that could not be rebuilt in the caller.

    Raised when the worker's exception cannot be pickled or unpickled (for example a
    class with an unusual constructor, or one the caller cannot import).

    Attributes:
        type_name: Qualified name of the exception type raised in the worker.
        traceback: The worker's formatted traceback.
        worker_index: Index of the worker that raised.
    """

    def __init__(self, type_name: str, message: str, traceback: str, worker_index: int) -> None:
        super().__init__(
            f"worker {worker_index} raised {type_name}: {message}\n"
            f"(the exception could not be rebuilt in this process; worker traceback below)\n"
            f"{traceback}"
        )
        self.type_name = type_name
        self.traceback = traceback
        self.worker_index = worker_index

    def __reduce__(self):  # keep it picklable for users who ship it around
        return (
            _rebuild_worker_error,
            (self.type_name, self.traceback, self.worker_index, str(self)),
        )


def _rebuild_worker_error(
    type_name: str, traceback: str, worker_index: int, text: str
) -> WorkerError:
    err = WorkerError.__new__(WorkerError)
    RuntimeError.__init__(err, text)
    err.type_name, err.traceback, err.worker_index = type_name, traceback, worker_index
    return err


#: What usually sends a signal that kills a worker.
_SIGNAL_CAUSES = {
    "SIGKILL": "the kernel's OOM killer (out of memory) or an outside kill",
    "SIGSEGV": "a crash in native code (simulator, renderer, C extension)",
    "SIGABRT": "a crash in native code (an abort(), a failed C assertion)",
    "SIGBUS": "a crash in native code (bad memory access, e.g. /dev/shm full)",
    "SIGFPE": "a crash in native code (arithmetic fault)",
    "SIGILL": "a crash in native code (illegal instruction)",
    "SIGTERM": "an outside request to stop (a job scheduler, kill)",
}


def describe_exit(exitcode: int | None) -> str:
    """``exitcode`` in words: a negative one names its signal and what usually sends it.

    Returns:
        e.g. ``"exit code -9 (killed by SIGKILL, signal 9: usually the kernel's OOM killer
        (out of memory) or an outside kill)"``, ``"exit code 3"``, ``"unknown exit code"``.
    """
    if exitcode is None:
        return "unknown exit code"
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"exit code {exitcode} (killed by signal {-exitcode})"
    cause = _SIGNAL_CAUSES.get(name)
    usual = f": usually {cause}" if cause else ""
    return f"exit code {exitcode} (killed by {name}, signal {-exitcode}{usual})"


class WorkerCrashedError(RuntimeError):
    """A worker process died (SIGKILL, segfault, ``os._exit``) or was killed by a deadline.

    A death by signal is named in the message with what usually sends it (SIGKILL: the
    OOM killer or an outside kill; SIGSEGV, SIGABRT: a crash in native code). A worker
    killed for overrunning ``step_deadline`` had its threads' Python stacks dumped first:
    they are in ``stacks`` and the innermost frames end the message.

    Attributes:
        worker_index: Index of the dead worker.
        env_indices: Global indices of the envs that lived in it.
        exitcode: The process exit code (negative: killed by that signal), or ``None``
            when the process could not be reaped.
        signal_name: Name of the signal that killed it (``"SIGKILL"``), or None.
        stacks: Every thread's Python stack just before a deadline kill (`faulthandler`'s
            text, most recent call first), or None.
    """

    def __init__(
        self,
        worker_index: int,
        env_indices: tuple[int, ...],
        exitcode: int | None,
        detail: str = "",
        stacks: str | None = None,
    ) -> None:
        text = (
            f"worker {worker_index} (envs {list(env_indices)}) died with "
            f"{describe_exit(exitcode)}"
            + (f": {detail}" if detail else "")
            + ". Its stage cannot step until it is reset; other stages keep working."
        )
        if stacks:
            text += "\nInnermost frames of its threads before the kill:\n" + innermost_frames(
                stacks
            )
        super().__init__(text)
        self.worker_index = worker_index
        self.env_indices = env_indices
        self.exitcode = exitcode
        self.detail = detail
        self.stacks = stacks
        self.signal_name = _signal_name(exitcode)

    def __reduce__(self):
        return (
            type(self),
            (self.worker_index, self.env_indices, self.exitcode, self.detail, self.stacks),
        )


def _signal_name(exitcode: int | None) -> str | None:
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return None


class StageFailedError(RuntimeError):
    """A stage is used after one of its workers failed, before the stage was reset.

    Attributes:
        stage: The failed stage's index.
    """

    def __init__(self, stage: int, reason: str) -> None:
        super().__init__(
            f"stage {stage} failed earlier ({reason}); reset the failed worker's envs "
            f"before stepping it again: reset(stage={stage}), reset(), or a reset whose "
            "options['reset_mask'] covers them"
        )
        self.stage = stage

    def __reduce__(self):
        return (_rebuild_stage_failed, (self.stage, str(self)))


def _rebuild_stage_failed(stage: int, text: str) -> StageFailedError:
    err = StageFailedError.__new__(StageFailedError)
    RuntimeError.__init__(err, text)
    err.stage = stage
    return err


class WaitTimeoutError(multiprocessing.TimeoutError, TimeoutError):
    """A wait ran past its ``timeout``; the call stays in flight.

    It is both `multiprocessing.TimeoutError` (what gymnasium's
    ``AsyncVectorEnv`` raises) and the builtin `TimeoutError`. A later wait on the
    same stage returns the call's real result.

    Also raised when a worker does not start within ``start_timeout`` (at construction,
    or in a rebuild past ``max_restarts``); that worker was killed, and the message says
    so.
    """


class ObservationError(ValueError):
    """An env's observation does not fit the observation space's layout (a shape that does
    not fit, a missing dict key, a value that cannot be cast to the space's dtype).

    Raised where a worker writes the observation into the shared buffers, which is where it
    fails: checking costs nothing while observations fit. The worker's other envs are
    written and their results come back (``partial_results`` / ``partial_mask`` on the
    caller's exception, as for any worker failure; from decoupled ``recv``, in the next
    ``recv`` calls).

    Attributes:
        env_index: Global index of the (first) env whose observation does not fit.
        key: Where in the observation, innermost (``"observation['wrist_image']"``).
        expected: What the space wants there (``"shape (64, 64, 3) uint8"``).
        received: What the env returned (``"shape (64, 64, 4) uint8"``).
        env_indices: Every env of the worker whose observation did not fit.
        worker_results: The worker's answer for its other envs: the command's payload (as
            for an `Ok` answer, the failed envs' rewards 0, flags False, infos empty), for
            the caller to keep; None once the caller took it.
    """

    def __init__(
        self,
        env_index: int,
        key: str,
        expected: str,
        received: str,
        env_indices: tuple[int, ...] = (),
        worker_results: Any = None,
    ) -> None:
        others = [g for g in env_indices if g != env_index]
        also = f" (also envs {others})" if others else ""
        super().__init__(
            f"env {env_index}: {key} does not fit the observation space: it should be "
            f"{expected}, got {received}{also}. Return observations of the space's shapes "
            "and keys (other dtypes are cast to the space's, as numpy's astype casts)"
        )
        self.env_index, self.key = env_index, key
        self.expected, self.received = expected, received
        self.env_indices = tuple(env_indices) or (env_index,)
        self.worker_results = worker_results

    def __reduce__(self):
        return (
            type(self),
            (
                self.env_index,
                self.key,
                self.expected,
                self.received,
                self.env_indices,
                self.worker_results,
            ),
        )
