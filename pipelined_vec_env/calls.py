"""The gymnasium call family of `PipelinedVectorEnv`: `call`, `get_attr`, `set_attr`.

`EnvCalls` holds the methods that reach the envs' attributes and methods inside the
workers (at once, or `call_async` then `call_wait`), over the stage stepping's calls, and
the call started by `call_async`. `PipelinedVectorEnv` inherits them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gymnasium.error import NoAsyncCallError

from .errors import WaitTimeoutError
from .stepping.stage_stepping import CallInFlight, StageStepping
from .workers.step_profile import step_profile_of

__all__ = ["EnvCalls"]


class EnvCalls:
    """`call`/`get_attr`/`set_attr` and their async and per-env forms, over a
    `StageStepping`; a base of `PipelinedVectorEnv`, documented there.

    Attributes:
        num_envs: Envs in all (set by the vector env).
    """

    num_envs: int

    def _attach_calls(self, stepping: StageStepping, check_open: Callable[[], None]) -> None:
        """Call the envs through ``stepping``; ``check_open`` raises once the env is closed."""
        self._calls_stepping = stepping
        self._calls_check_open = check_open
        self._pending_call: CallInFlight | None = None  # a call started by call_async

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` on every env (its value if it is not callable), like gymnasium.

        Every stage must be idle.

        Returns:
            One result per env, in env order.
        """
        return self.call_at(None, name, *args, **kwargs)

    def call_at(
        self,
        env_indices: Sequence[int] | None,
        name: str | Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Like [`call`][pipelined_vec_env.PipelinedVectorEnv.call] but only on the envs ``env_indices`` (global; None: all).

        ``name`` may also be a picklable function, called in the worker as
        ``name(env, *args, **kwargs)`` with the (wrapped) env, e.g. to check its wrappers.
        The stages holding those envs must be idle; other stages may be busy.

        Returns:
            One result per selected env, in the order of ``env_indices``.
        """
        self._calls_check_open()
        self._pending_call = self._calls_stepping.start_call(env_indices, name, args, kwargs)
        return self.call_wait()

    def call_async(self, name: str | Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Start calling ``name`` on every env and return (gymnasium ``AsyncVectorEnv``'s
        ``call_async``); collect the results with [`call_wait`][pipelined_vec_env.PipelinedVectorEnv.call_wait].

        Raises:
            AlreadyPendingCallError: A stage has a call in flight.
        """
        self._calls_check_open()
        self._pending_call = self._calls_stepping.start_call(None, name, args, kwargs)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call started by [`call_async`][pipelined_vec_env.PipelinedVectorEnv.call_async].

        Args:
            timeout: Seconds to wait; None waits as long as the workers are alive (a dead
                worker is noticed at once).

        Returns:
            One result per env, in env order.

        Raises:
            NoAsyncCallError: No call in flight.
            WaitTimeoutError: Timed out; the call stays in flight and a later
                ``call_wait`` returns its results.
            The env's exception / WorkerCrashedError: A worker failed (the call ends).
        """
        self._calls_check_open()
        if self._pending_call is None:
            raise NoAsyncCallError("call_wait without a prior call_async", "call")
        try:
            result = self._calls_stepping.gather(self._pending_call, timeout)
        except WaitTimeoutError:
            raise
        except BaseException:
            self._pending_call = None
            raise
        self._pending_call = None
        return result

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Get attribute ``name`` of every env (through wrappers), like gymnasium."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every env.

        Args:
            name: Attribute name (set through wrappers with ``set_wrapper_attr``).
            values: A list or tuple with one value per env, or one value for all.

        Raises:
            ValueError: A list/tuple whose length is not ``num_envs``.
        """
        self.set_attr_at(None, name, values)

    def set_attr_at(self, env_indices: Sequence[int] | None, name: str, values: Any) -> None:
        """Like [`set_attr`][pipelined_vec_env.PipelinedVectorEnv.set_attr] but only on the envs ``env_indices`` (global; None: all)."""
        self._calls_check_open()
        count = self.num_envs if env_indices is None else len(env_indices)
        if not isinstance(values, (list, tuple)):
            values = [values] * count
        if len(values) != count:
            raise ValueError(
                f"values: expected one value per env ({count}) or a single value, got {len(values)}"
            )
        self._calls_stepping.gather(self._calls_stepping.start_set_attr(env_indices, name, values))

    def step_profiles(self) -> tuple[dict[str, Any], ...]:
        """How each env's worker steps it, and why: serially, or concurrently on threads
        of the worker (envs whose steps wait off the CPU; see docs/stages.md, "The default
        layout"). Every stage must be idle.

        Returns:
            One dict per env, in env order: ``stepping`` (``"serial"`` or
            ``"concurrent"``), ``reason`` (words), ``declared`` (the env's
            ``metadata["step_concurrency"]`` or None), ``envs_in_worker``, and once
            measured ``off_cpu_share`` (in ``[0, 1]``), ``wall_ms_per_step``,
            ``cpu_ms_per_step`` (the worker process's), ``waited_ms_per_step`` (runnable,
            waiting for a core) and ``steps`` (of the last serial measurement window).
        """
        return self.call_at(None, step_profile_of)

    def render(self) -> tuple[Any, ...]:
        """Return one rendered frame per env (``render_mode`` set at env construction)."""
        return self.call("render")
