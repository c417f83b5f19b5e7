"""The decoupled stepping methods of `PipelinedVectorEnv`: `async_reset`, `recv`, `send`.

`DecoupledMethods` holds the public face of decoupled stepping (EnvPool's
`async_reset`/`recv`/`send`, every env at its own pace) over the vector env's
`DecoupledState`, which keeps the bookkeeping. `PipelinedVectorEnv` inherits them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..reset_arguments import reset_arguments
from .decoupled import DecoupledState
from .decoupled_guards import check_can_reset
from .stage_stepping import StageStepping
from .stages import Stage

__all__ = ["DecoupledMethods"]


class DecoupledMethods:
    """`async_reset`/`recv`/`send` over a `DecoupledState`; a base of
    `PipelinedVectorEnv`, documented there.

    Attributes:
        num_envs: Envs in all (set by the vector env).
        stages: The vector env's stages (set by the vector env).
        decoupled: The bookkeeping of decoupled stepping (set by the vector env).
    """

    num_envs: int
    stages: tuple[Stage, ...]
    decoupled: DecoupledState

    def _attach_decoupled(self, stepping: StageStepping, check_open: Callable[[], None]) -> None:
        """Revive dead workers through ``stepping``; ``check_open`` raises once closed."""
        self._decoupled_stepping = stepping
        self._decoupled_check_open = check_open

    def async_reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> None:
        """Start resetting every env for decoupled stepping (EnvPool's ``async_reset``).

        Afterwards, [`recv`][pipelined_vec_env.PipelinedVectorEnv.recv] returns the results of whichever envs are ready and
        [`send`][pipelined_vec_env.PipelinedVectorEnv.send] steps any subset of the received envs; every env advances at its own
        pace. ``seed`` and ``options`` work as in [`reset_async`][pipelined_vec_env.PipelinedVectorEnv.reset_async] (``reset_mask`` is
        not supported here). Autoreset follows ``autoreset_mode``.

        Raises:
            RuntimeError: A stage has a call in flight, or envs are still in flight from
                an earlier ``send``.
        """
        self._decoupled_check_open()
        check_can_reset(self.decoupled)
        everything = slice(0, self.num_envs)
        seeds, per_env, mask = reset_arguments(seed, options, everything)
        if not mask.all():
            raise ValueError("async_reset: options['reset_mask'] is not supported; reset all envs")
        self._decoupled_stepping.revive_dead(list(self.stages), mask, everything)
        self.decoupled.async_reset(seeds, per_env)

    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Return the results of at least ``batch_size`` envs (None: whatever is ready, at
        least one), waiting if needed.

        Every result that is ready comes back, so envs whose steps take equally long,
        finishing together, may all return from one call and the loop falls into
        lockstep. For EnvPool's exact batches (inference on one batch while the others step),
        infer on the first ``batch_size`` rows and hold the rest for the next inference
        (``benchmarks/gpu_stages.py``, ``run_decoupled``).

        Returns:
            ``(observations, rewards, terminations, truncations, infos)`` batched over the
            returned envs, in arrival order; ``infos["env_id"]`` (int64) holds their global
            ids. A reset's result has reward 0 and no termination. Counts are in envs.

        Raises:
            NoAsyncCallError: No [`async_reset`][pipelined_vec_env.PipelinedVectorEnv.async_reset] first.
            ValueError: ``batch_size`` larger than the envs in flight.
            WaitTimeoutError: Fewer than ``batch_size`` results within ``timeout``
                seconds; what arrived stays queued for the next ``recv``.
            WorkerCrashedError / the worker's exception: A worker failed (past
                ``max_restarts``); its envs leave the decoupled flow (reset them), the
                others go on. Within the bound the worker is rebuilt here instead: its
                envs whose step was lost are returned with ``truncated=True`` and
                ``info["worker_restarted"]``; a sibling not in flight gets that result
                from its next [`send`][pipelined_vec_env.PipelinedVectorEnv.send] (docs/fault_tolerance.md).
            ObservationError: An env's observation does not fit the observation space;
                that env leaves the decoupled flow until a reset, and the results of its
                worker's other envs come out of the next ``recv`` calls.
        """
        self._decoupled_check_open()
        return self.decoupled.recv(batch_size, timeout)

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray) -> None:
        """Send actions to envs returned by [`recv`][pipelined_vec_env.PipelinedVectorEnv.recv] and not yet sent (any subset).

        Args:
            actions: A batch with one action per id, in gymnasium's batched layout (numpy
                or torch).
            env_ids: Global env ids, as in ``infos["env_id"]``.

        Raises:
            ValueError: Unknown, duplicate or not-received ids, or bad actions (before any
                worker is touched).
        """
        self._decoupled_check_open()
        self.decoupled.send(actions, env_ids)
