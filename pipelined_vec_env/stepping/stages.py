"""The stage scheduler: how envs split into stages and workers, and each stage's call state.

Envs ``[0, num_envs)`` split into ``num_stages`` contiguous slices the way
`numpy.array_split` splits (sizes differ by at most one, larger ones first); each
stage's envs split the same way over ``ceil(stage_size / envs_per_worker)`` workers. A
stage has at most one call in flight (``step``, ``reset``, ``call`` or ``set_attr``), its
own failure flag, and its own answers, so one stage can reset while another steps and a
failed stage never blocks the others. The idea of splitting envs into pipeline stages so
that inference on one overlaps simulation of another comes from verl's VLA ``EnvLoop`` and
RLinf's pipelined rollout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError

from ..errors import StageFailedError, WaitTimeoutError
from ..workers.failures import describe_failure, raise_worker_error
from ..workers.protocol import Answer, Ok, Raised
from ..workers.transport import WorkerTransport
from ..workers.waiting import deadline_after, remaining

if TYPE_CHECKING:
    from ..workers.pool import WorkerPool

__all__ = ["Stage", "StageState", "split_range", "wait_any_stage"]


class StageState(StrEnum):
    """What a stage is doing: idle, or the one call it has in flight (as gymnasium's
    ``AsyncState`` for an ``AsyncVectorEnv``). A `str` subclass: compares equal to its
    value (``"step"`` ...), which is also the call's name in messages."""

    IDLE = "idle"
    RESET = "reset"
    STEP = "step"
    CALL = "call"
    SET_ATTR = "set_attr"


#: Each state by its value: `Stage.mark` looks its op up here (a dict lookup, where calling
#: the enum by value goes through the enum machinery's Python code).
_STATE_OF = {state.value: state for state in StageState}


def split_range(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """Split ``[start, stop)`` into ``parts`` contiguous ranges like ``np.array_split``.

    Examples:
        >>> split_range(0, 7, 3)
        [(0, 3), (3, 5), (5, 7)]
    """
    size, extra = divmod(stop - start, parts)
    bounds = []
    lo = start
    for i in range(parts):
        hi = lo + size + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


@dataclass
class Stage:
    """One pipeline stage: a contiguous slice of envs, its workers and its call state.

    Attributes:
        index: Stage index.
        envs: Global env indices of the stage, as a slice.
        workers: The workers serving the stage, in env order.
        state: The call in flight, or `StageState.IDLE`.
        whole: The call in flight belongs to a whole-env call (``stage=None``).
        failed: Failed workers (index -> why); a failed stage must be reset, at least
            every env of each failed worker (a ``reset_mask`` covering them will do).
        context: Per-call data kept between the async and the wait half.
        profiler: The vector env's ``Profiler`` when profiling is on (else None): told
            when a call starts, when the caller starts waiting and when the call ends.
    """

    index: int
    envs: slice
    workers: list[WorkerTransport]
    state: StageState = StageState.IDLE
    whole: bool = False
    failed: dict[int, str] = field(default_factory=dict)
    context: Any = None
    profiler: Any = None

    @property
    def failure(self) -> str | None:
        """Why the stage failed (its failed workers), or None."""
        return "; ".join(self.failed.values()) if self.failed else None

    def fail(self, worker: Any, reason: str) -> None:
        """Mark the stage failed because of ``worker``."""
        self.failed.setdefault(worker.index, reason)

    def recover(self, reset_envs: set[int] | None = None) -> None:
        """Clear the failure of every worker whose envs were all reset (None: all)."""
        for w in self.workers:
            if w.index in self.failed and (reset_envs is None or set(w.env_indices) <= reset_envs):
                del self.failed[w.index]

    @property
    def busy(self) -> bool:
        """Whether a call is in flight."""
        return self.state is not StageState.IDLE

    @property
    def size(self) -> int:
        """Number of envs in the stage."""
        return self.envs.stop - self.envs.start

    def begin(self, op: str, whole: bool) -> None:
        """Check that ``op`` may start on this stage.

        Raises:
            AlreadyPendingCallError: A call is already in flight on the stage.
            StageFailedError: The stage failed and ``op`` is not a reset.
        """
        if self.busy:
            where = "" if self.whole else f"stage={self.index}"
            raise AlreadyPendingCallError(
                f"stage {self.index} has a `{self.state}` call in flight; call "
                f"`{self.state}_wait({where})` before starting `{op}`",
                self.state,
            )
        if self.failure is not None and op != "reset":
            raise StageFailedError(self.index, self.failure)

    def mark(self, op: str, whole: bool, context: Any = None) -> None:
        """Record that ``op`` is now in flight."""
        self.state, self.whole, self.context = _STATE_OF[op], whole, context
        if self.profiler is not None:
            self.profiler.stage_started(self.index, op)

    def check_wait(self, op: str, whole: bool) -> None:
        """Check that a wait for ``op`` matches the call in flight.

        Raises:
            NoAsyncCallError: No ``op`` call in flight on this stage, or it was started for
                the whole env (``stage=None``) and is awaited per stage, or vice versa.
        """
        if self.state != op:
            wait_name = f"{op}_wait" if op in ("step", "reset") else op
            raise NoAsyncCallError(
                f"`{wait_name}` on stage {self.index} without a prior `{op}` call "
                f"(in flight: {self.state if self.busy else None})",
                op,
            )
        if self.profiler is not None:
            self.profiler.wait_started(self.index)
        if self.whole != whole:
            started = "for all stages (stage=None)" if self.whole else f"with stage={self.index}"
            raise NoAsyncCallError(
                f"stage {self.index}'s `{op}` was started {started}; wait for it the same way",
                op,
            )

    def finish(
        self, answers: dict[int, Answer | None]
    ) -> tuple[list[tuple[WorkerTransport, Any]], BaseException | None]:
        """Consume the answers of the call in flight and return the stage to idle.

        Args:
            answers: Worker index -> its answer to the call (taken from the pool once
                every worker answered, see `WorkerPool.wait`); None or missing: the
                worker had nothing to do in this call.

        Returns:
            ``(results, error)``: ``(worker, payload)`` for each worker that answered
            ``ok``, and the first failure as an exception (not raised). A failed ``step``
            or ``reset`` marks the stage failed (its envs are in an unknown state); a
            failed ``call``/``set_attr`` does not.
        """
        results = []
        error: BaseException | None = None
        for worker in self.workers:
            answer = answers.get(worker.index)
            if answer is None:
                continue  # the worker had nothing to do in this call
            if isinstance(answer, Ok):
                results.append((worker, answer.payload))
                continue
            try:
                raise_worker_error(worker, answer)
            except BaseException as exc:  # noqa: BLE001 - kept and raised by the caller
                if error is None:
                    error = exc
                reason = describe_failure(worker, answer)
                if not isinstance(answer, Raised) or self.state in (
                    StageState.STEP,
                    StageState.RESET,
                ):
                    self.fail(worker, reason)
        self.state, self.whole, self.context = StageState.IDLE, False, None
        if self.profiler is not None:
            self.profiler.stage_finished(self.index)
        return results, error


def wait_any_stage(stages: list[Stage], pool: WorkerPool, timeout: float | None) -> int:
    """Return the index of a stage whose call in flight has completed, waiting if needed.

    Among completed stages the lowest index is returned. The call stays in flight: collect
    it with the matching wait (``step_wait(stage=s)`` ...).

    Raises:
        NoAsyncCallError: No stage has a call in flight.
        WaitTimeoutError: None completed within ``timeout`` seconds.
    """
    busy = [s for s in stages if s.busy]
    if not busy:
        raise NoAsyncCallError("wait_any: no stage has a call in flight", "wait_any")
    deadline = deadline_after(timeout)
    profiler, t0 = busy[0].profiler, time.monotonic_ns()
    while True:
        for stage in busy:
            if pool.idle(stage.workers):
                if profiler is not None:
                    profiler.caller_waited("wait_any", t0, stage.index)
                return stage.index
        pool.poll([w for s in busy for w in s.workers], remaining(deadline))
        if (
            deadline is not None
            and remaining(deadline) == 0
            and not any(pool.idle(s.workers) for s in busy)
        ):
            raise WaitTimeoutError(f"no stage completed within {timeout} s")


def check_startable(stages: list[Stage], op: str, whole: bool) -> None:
    """Run [`Stage.begin`][pipelined_vec_env.stepping.stages.Stage.begin] on each stage (all checks before any worker is touched)."""
    for stage in stages:
        stage.begin(op, whole)
