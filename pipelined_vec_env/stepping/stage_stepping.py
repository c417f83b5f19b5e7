"""Stage stepping on the pool: a call sent to some stages' workers and awaited until their
queues are empty.

`PipelinedVectorEnv` checks its arguments and keeps the gymnasium contract; what happens
between the check and the returned batch is here: grouping envs by worker, sending the
call (`WorkerPool.send`), waiting for the workers' queues to empty (`WorkerPool.wait`),
rebuilding a failed worker within ``max_restarts`` and turning the rebuild into the answer
the caller sees (the reset's for a reset, a step whose episodes end with
``truncated=True`` for a step), then putting the results together: observations from the
`ObservationStore`, rewards and flags per env, infos merged (`infos.add_env_info`), and a
failure raised with the healthy envs' ``partial_results``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from ..batching import batch_slice
from ..errors import ObservationError
from ..infos import add_env_info
from ..observations import ObservationStore, RowCopy
from ..workers.pool import WorkerPool
from ..workers.protocol import Answer, Command, Ok, StepRequest
from ..workers.slots import ColumnInfos, SlotRead, read_step
from ..workers.spinning import hand_over_core
from ..workers.transport import WorkerTransport
from .decoupled import DecoupledState
from .stages import Stage, StageState, check_startable

__all__ = ["CallInFlight", "StageStepping", "attach_partial"]

logger = logging.getLogger(__name__)

#: A ``call``/``set_attr`` in flight: its stages, the envs per worker (local indices) and
#: the env indices it was asked for (None: all).
CallInFlight = tuple[list[Stage], dict[WorkerTransport, list[int]], Sequence[int] | None]


def attach_partial(error: BaseException, results: tuple, mask: np.ndarray) -> None:
    """Give a failed wait's exception the results of the envs that did answer.

    ``error.partial_results`` is ``(obs, rewards, terminations, truncations, infos)`` in the
    call's layout; ``error.partial_mask`` (bool, one per env of the call) is True where the
    env's results are real. Elsewhere obs is the env's last observation, reward 0, flags
    False, and infos have no entry.
    """
    try:
        error.partial_results = results  # type: ignore[attr-defined]
        error.partial_mask = mask  # type: ignore[attr-defined]
    except AttributeError:  # an exception type that refuses attributes (__slots__)
        logger.warning("could not attach partial results to %r", error)


def _own_arrays(payload: tuple, n: int) -> bool:
    """Whether a step answer's rewards and flags are ``n`` float64 / bool arrays."""
    _, rewards, terminations, truncations, _ = payload
    return (
        type(rewards) is np.ndarray
        and type(terminations) is np.ndarray
        and type(truncations) is np.ndarray
        and rewards.shape == (n,)
        and rewards.dtype == np.float64
        and terminations.shape == truncations.shape == (n,)
        and terminations.dtype == truncations.dtype == np.bool_
    )


def _column_results(
    answered: list[tuple[WorkerTransport, Any]], start: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]] | None:
    """``(rewards, terminations, truncations, infos)`` of a step whose every worker answered
    through its slot for all its envs (`slots.SlotRead`), the workers in env order covering
    the ``n`` envs from ``start``, joined straight from the slots (`slots.read_step`);
    None for any other step (the general path then puts it together env by env, with the
    same result)."""
    reads = []
    covered = 0
    for worker, payload in answered:
        if (
            type(payload) is not SlotRead
            or not payload.in_slot()
            or payload.count != len(worker.env_indices)
            or worker.env_indices[0] - start != covered
        ):
            return None
        reads.append(payload)
        covered += payload.count
    if covered != n or not reads:
        return None
    return read_step(reads, n)


def _salvage(error: BaseException | None) -> tuple[int, Any, tuple[int, ...]] | None:
    """``(an env of the worker, its answer payload, the failed envs)`` that an
    `ObservationError` carries for the worker's other envs (taken from it: the caller's
    ``partial_results`` hold them from now on), or None."""
    if not isinstance(error, ObservationError) or error.worker_results is None:
        return None
    results, error.worker_results = error.worker_results, None
    return error.env_index, results, error.env_indices


def _empty_infos(n: int, info_layout: str) -> Any:
    return [{} for _ in range(n)] if info_layout == "per_env" else {}


class StageStepping:
    """Stage calls of one vector env over its `WorkerPool`.

    Args:
        stages: The vector env's stages.
        pool: Its pool.
        observations: Its observations.
        decoupled: Its decoupled stepping (stage calls refuse the envs it drives).
        num_envs: Number of envs.
        autoreset_mode: The envs' autoreset mode (what a restart's truncated step looks
            like).
        max_restarts: Rebuilds allowed per worker.
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        pool: WorkerPool,
        observations: ObservationStore,
        decoupled: DecoupledState,
        *,
        num_envs: int,
        autoreset_mode: AutoresetMode,
        max_restarts: int,
    ) -> None:
        self.stages = tuple(stages)
        self.pool = pool
        self.observations = observations
        self.decoupled = decoupled
        self.num_envs = num_envs
        self.autoreset_mode = autoreset_mode
        self.max_restarts = max_restarts

    # ------------------------------------------------------------------ reset

    def send_reset(
        self,
        stages: list[Stage],
        envs: slice,
        seeds: list[Any],
        per_env: list[dict[str, Any] | None],
        mask: np.ndarray,
        whole: bool,
    ) -> None:
        """Rebuild the dead workers of ``stages`` (the reset covers them), then send a reset
        of the envs of ``envs`` selected by ``mask`` (checked arguments, one per env)."""
        self.revive_dead(stages, mask, envs)
        for s in stages:
            reset_ids: dict[int, list[int]] = {}
            for w in s.workers:
                ids = [g for g in w.env_indices if mask[g - envs.start]]
                if ids:
                    requests = [
                        (g - w.env_indices[0], seeds[g - envs.start], per_env[g - envs.start])
                        for g in ids
                    ]
                    self.observations.begin_first(ids)
                    self.pool.send(w, Command.RESET, requests, ids)
                    reset_ids[w.index] = ids
            s.mark("reset", whole, context=reset_ids)

    def revive_dead(self, stages: list[Stage], mask: np.ndarray, envs: slice) -> None:
        """Have the pool rebuild the dead workers of ``stages`` before a reset of the envs
        of ``envs`` selected by ``mask`` (see `WorkerPool.revive_dead`)."""
        reset_envs = {g for g in range(envs.start, envs.stop) if mask[g - envs.start]}
        self.pool.revive_dead([w for s in stages for w in s.workers], reset_envs)

    def collect_reset(
        self,
        stages: list[Stage],
        envs: slice,
        whole: bool,
        timeout: float | None,
        *,
        info_layout: str,
        copy: bool,
    ) -> tuple[Any, Any]:
        """Wait for the reset of ``stages`` and return ``(obs, infos)`` for ``envs``.

        Raises:
            WorkerCrashedError / the worker's exception: The first failure, with
                ``partial_results`` (see `PipelinedVectorEnv.reset_wait`).
        """
        contexts = {s.index: s.context for s in stages}
        collected, error = self.wait(stages, "reset", whole, timeout)
        n = envs.stop - envs.start
        real = np.zeros(n, dtype=np.bool_)
        infos = _empty_infos(n, info_layout)
        for s, results in collected:
            reset_ids = contexts[s.index]
            # a failed worker whose envs were all reset is healthy again
            s.recover({g for worker, _ in results for g in reset_ids[worker.index]})
            for worker, (items, env_infos) in results:
                for k, g in enumerate(reset_ids[worker.index]):
                    real[g - envs.start] = True
                    if items is not None:
                        self.observations.keep(g, items[k])
                    for info in env_infos[k]:
                        infos = add_env_info(infos, info, g - envs.start, n)
        salvaged = _salvage(error)
        if salvaged is not None:  # the other envs of a worker with an observation error
            worker, (items, env_infos), failed = salvaged
            worker = self.pool.worker_of(worker)
            for k, g in enumerate(contexts[worker.stage][worker.index]):
                if g in failed:
                    continue
                real[g - envs.start] = True
                for info in env_infos[k]:
                    infos = add_env_info(infos, info, g - envs.start, n)
        obs = self.observations.batch(envs, copy)
        if error is not None:
            zeros = np.zeros(n, dtype=np.bool_)
            attach_partial(error, (obs, np.zeros(n), zeros, zeros.copy(), infos), real)
            raise error
        return obs, infos

    # ------------------------------------------------------------------ step

    def send_step(
        self,
        stages: list[Stage],
        envs: slice,
        batch: Any,
        space: Any,
        whole: bool,
        copy: bool = True,
    ) -> None:
        """Send each worker of ``stages`` its rows of ``batch`` (checked actions of ``space``
        for the envs ``envs``), and the generation of the observation buffers to write
        (`ObservationStore.begin_step`: with ``copy``, a free one of the ring's)."""
        start, send = envs.start, self.pool.send
        array = type(batch) is np.ndarray  # an array space's batch: rows are a slice
        gen = self.observations.begin_step(envs, copy)
        for s in stages:
            for w in s.workers:
                lo = w.env_indices[0] - start
                hi = lo + len(w.env_indices)
                rows = batch[lo:hi] if array else batch_slice(space, batch, slice(lo, hi))
                send(w, Command.STEP, StepRequest(None, rows, gen), w.env_indices)
            s.mark("step", whole)
        if whole and self.pool.workers_spin:
            # one of them may share this core: let it start now (only for a whole-env
            # step: after a stage's step_async the caller has other stages to serve)
            hand_over_core(self.pool.profiler)

    def collect_step(
        self,
        stages: list[Stage],
        envs: slice,
        whole: bool,
        timeout: float | None,
        *,
        info_layout: str,
        copy: bool,
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Wait for the step of ``stages`` and return its 5-tuple for ``envs``.

        Raises:
            WorkerCrashedError / the worker's exception: The first failure, with
                ``partial_results`` (see `PipelinedVectorEnv.step_wait`).
        """
        n, start = envs.stop - envs.start, envs.start
        gen = self.observations.step_generation(envs)
        rows = self.observations.row_copy(envs) if copy and not gen else None
        on_answer = None if rows is None else self._row_copier(rows)
        collected, error = self.wait(stages, "step", whole, timeout, on_answer)
        answered = [pair for _, results in collected for pair in results]
        if error is None and info_layout != "per_env":
            columns = _column_results(answered, start, n)
            if columns is not None:  # the fast path's answers: no per-env work
                self.observations.end_step(envs)
                return (self._step_observations(envs, copy, rows, gen), *columns)
        # the general path: each answer's results copied out of its slot first
        answered = [(w, p.read() if type(p) is SlotRead else p) for w, p in answered]
        salvaged = _salvage(error)
        if salvaged is not None:  # the other envs of a worker with an observation error
            answered.append((self.pool.worker_of(salvaged[0]), salvaged[1]))
        infos = _empty_infos(n, info_layout)
        batched = isinstance(infos, dict)
        if len(answered) == 1 and _own_arrays(answered[0][1], n):
            # one worker answered for every env with fresh float64/bool arrays (its
            # slot's copies): they are the call's (nobody else holds them)
            _, rewards, terminations, truncations, _ = answered[0][1]
            fill = False
        else:
            rewards = np.zeros(n, dtype=np.float64)
            terminations = np.zeros(n, dtype=np.bool_)
            truncations = np.zeros(n, dtype=np.bool_)
            fill = True
        for worker, (items, rew, term, trunc, env_infos) in answered:
            lo = worker.env_indices[0] - start
            if fill:
                hi = lo + len(worker.env_indices)
                rewards[lo:hi], terminations[lo:hi], truncations[lo:hi] = rew, term, trunc
            if items is None and batched and isinstance(env_infos, ColumnInfos):
                infos = env_infos.merge_into(infos, lo, n)  # the fast path's info columns
                continue
            for k, g in enumerate(worker.env_indices):
                if items is not None:
                    self.observations.keep(g, items[k])
                for info in env_infos[k]:
                    infos = add_env_info(infos, info, g - start, n)
        if error is None:
            self.observations.end_step(envs)
            obs = self._step_observations(envs, copy, rows, gen)
            return obs, rewards, terminations, truncations, infos
        real = np.zeros(n, dtype=np.bool_)
        for worker, _ in answered:
            lo = worker.env_indices[0] - start
            real[lo : lo + len(worker.env_indices)] = True
        for g in () if salvaged is None else salvaged[2]:
            real[g - start] = False
        self.observations.end_step(envs, real)
        # each env's row from the generation of its latest observation
        obs = self.observations.batch(envs, copy)
        attach_partial(error, (obs, rewards, terminations, truncations, infos), real)
        raise error

    def _row_copier(self, rows: RowCopy) -> Callable[[WorkerTransport, Answer], None]:
        """``on_answer`` of a step's wait: copy the rows of a worker that answered its
        step (in shared memory) while the others still step; a profiled env records each
        copy as an ``"observation copy"`` span."""
        profiler = self.pool.profiler

        def copy_rows(worker: WorkerTransport, answer: Answer) -> None:
            if not answer.ok:  # a failure: its rows are copied at the end, maybe rebuilt
                return
            lo, hi = worker.env_indices[0], worker.env_indices[-1] + 1
            if profiler is None:
                rows.copy_rows(lo, hi)
                return
            with profiler.span("observation copy"):
                rows.copy_rows(lo, hi)

        return copy_rows

    def _step_observations(
        self, envs: slice, copy: bool, rows: RowCopy | None, gen: int = 0
    ) -> Any:
        """The observations a step returns: the ring generation ``gen``'s views where the
        step wrote one, else ``rows`` finished (the rows not copied as their worker
        answered), else the store's batch (views with ``copy=False``). A profiled env
        records each copy out of shared memory as an ``"observation copy"`` span."""
        profiler = self.pool.profiler
        if gen:
            return self.observations.step_batch(envs, gen)
        if rows is None:
            if profiler is None or not copy or not self.observations.shared:
                return self.observations.batch(envs, copy)
            with profiler.span("observation copy"):
                return self.observations.batch(envs, copy)
        if profiler is None or rows.complete:
            return rows.result()
        with profiler.span("observation copy"):
            return rows.result()

    # ------------------------------------------------------------------ calls

    def start_call(
        self, env_indices: Sequence[int] | None, name: Any, args: tuple, kwargs: dict[str, Any]
    ) -> CallInFlight:
        """Send ``name(*args, **kwargs)`` to the envs ``env_indices`` (None: all)."""
        groups = self._group(env_indices)
        stages = [self.stages[s] for s in {w.stage for w in groups}]
        check_startable(stages, "call", False)
        for w, locals_ in groups.items():
            ids = [w.env_indices[k] for k in locals_]
            self.pool.send(w, Command.CALL, (name, args, kwargs, locals_), ids)
        for s in stages:
            s.mark("call", False)
        return stages, groups, env_indices

    def start_set_attr(
        self, env_indices: Sequence[int] | None, name: str, values: Sequence[Any]
    ) -> CallInFlight:
        """Send ``set_attr(name, value)`` to the envs ``env_indices`` (None: all), one value
        per env (checked)."""
        targets = list(range(self.num_envs)) if env_indices is None else list(env_indices)
        by_env = dict(zip(targets, values, strict=False))
        groups = self._group(env_indices)
        stages = [self.stages[s] for s in {w.stage for w in groups}]
        check_startable(stages, "set_attr", False)
        for w, locals_ in groups.items():
            ids = [w.env_indices[k] for k in locals_]
            self.pool.send(w, Command.SET_ATTR, (name, [by_env[g] for g in ids], locals_), ids)
        for s in stages:
            s.mark("set_attr", False)
        return stages, groups, env_indices

    def gather(self, call: CallInFlight, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for ``call`` and return one result per env asked, in that order.

        Raises:
            WaitTimeoutError: Timed out (the call stays in flight).
            The env's exception / WorkerCrashedError: A worker failed.
        """
        stages, groups, env_indices = call
        op = stages[0].state if stages else StageState.CALL
        collected, error = self.wait(stages, op, False, timeout)
        if error is not None:
            raise error
        value: dict[int, Any] = {}
        for _, results in collected:
            for worker, payload in results:
                if payload is None:
                    continue
                for local, result in zip(groups[worker], payload, strict=False):
                    value[worker.env_indices[local]] = result
        targets = range(self.num_envs) if env_indices is None else env_indices
        return tuple(value.get(int(g)) for g in targets)

    def _group(self, env_indices: Sequence[int] | None) -> dict[WorkerTransport, list[int]]:
        targets = range(self.num_envs) if env_indices is None else env_indices
        groups: dict[WorkerTransport, list[int]] = {}
        for g in targets:
            if not isinstance(g, (int, np.integer)) or not 0 <= g < self.num_envs:
                raise ValueError(f"env_indices: expected ints in [0, {self.num_envs}), got {g!r}")
            w = self.pool.worker_of(int(g))
            groups.setdefault(w, []).append(int(g) - w.env_indices[0])
        busy = [w.index for w in groups if self.decoupled.drives(w)]
        if busy:
            raise RuntimeError(
                f"workers {busy} have send/recv commands in flight; recv their results first"
            )
        return groups

    # ------------------------------------------------------------------ waiting

    def wait(
        self,
        stages: list[Stage],
        op: str,
        whole: bool,
        timeout: float | None,
        on_answer: Callable[[WorkerTransport, Answer], None] | None = None,
    ) -> tuple[list, BaseException | None]:
        """Wait for ``op`` on ``stages`` (restarting failed workers within ``max_restarts``);
        return the ``(stage, results)`` pairs of every stage, drained, and the first
        failure (not raised), or None. ``on_answer`` is `WorkerPool.wait`'s."""
        for stage in stages:
            stage.check_wait(op, whole)
        workers = [w for s in stages for w in s.workers]
        self.pool.wait(workers, timeout, on_answer)
        answers = {w.index: self.pool.take(w) for w in workers}
        if op in ("step", "reset") and self.max_restarts:
            failed = []  # every worker of the call to restart: rebuilt together
            for stage in stages:
                for w in stage.workers:
                    failure = answers[w.index]
                    if failure is not None and not failure.ok and w.restarts < self.max_restarts:
                        failed.append((stage, w, failure))
            if failed:
                rebuilt = self.pool.rebuild([(w, failure, op) for _, w, failure in failed])
                for stage, w, _ in failed:
                    answers[w.index] = self._stand_in(w, rebuilt[w.index], op, stage.context)
        collected, error = [], None
        for stage in stages:
            results, stage_error = stage.finish(answers)
            collected.append((stage, results))
            error = error or stage_error
        return collected, error

    def _stand_in(self, w: WorkerTransport, answer: Answer, op: str, context: Any) -> Answer:
        """The answer that stands in for worker ``w``'s failed ``op`` once the pool rebuilt
        it (``answer``: the rebuild's, `WorkerPool.rebuild`): the reset's for a reset, else
        a step whose episodes end with ``truncated=True``; a failed rebuild's own."""
        if not answer.ok:
            return answer
        items, reset_infos = answer.payload
        if op == "reset":
            reset_ids = context
            keep = [g - w.env_indices[0] for g in reset_ids.get(w.index, [])]
            return Ok(
                (
                    None if items is None else [items[k] for k in keep],
                    [reset_infos[k] for k in keep],
                )
            )
        n = len(w.env_indices)
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            # the truncated step is followed by an autoreset step, as for any episode end
            self.pool.send(w, Command.SET_AUTORESET, list(range(n)))
        elif self.autoreset_mode == AutoresetMode.SAME_STEP:
            # the simulator's last observation is lost: the fresh one stands in as final_obs
            store = self.observations
            finals = items if items is not None else [store.single(g) for g in w.env_indices]
            for k in range(n):
                reset_infos[k].insert(
                    0, {"final_obs": finals[k], "final_info": {"worker_restarted": True}}
                )
        return Ok(
            (
                items,
                np.zeros(n, dtype=np.float64),
                np.zeros(n, dtype=np.bool_),
                np.ones(n, dtype=np.bool_),
                reset_infos,
            )
        )
