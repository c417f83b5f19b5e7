"""Decoupled stepping: EnvPool-style ``async_reset`` / ``recv`` / ``send`` over the workers.

Instead of stepping a whole stage at once, every env is an independent producer: the
caller receives the results of whichever envs are ready (``recv``), and sends actions to
any subset of the envs it received (``send``). A worker holding several envs may have
several commands queued; its answers come back in order. This is the single-consumer API
of EnvPool (Weng et al., 2022, "EnvPool: A Highly Parallel Reinforcement Learning
Environment Execution Engine"), the base that `pipelined_vec_env.stepping.channel` builds
RLinf-style multi-actor inference on.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.error import NoAsyncCallError
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array

from ..batching import batch_slice, check_actions, to_numpy
from ..errors import WaitTimeoutError, WorkerCrashedError
from ..infos import merge_info
from ..observations import ObservationStore
from ..workers.failures import describe_failure, raise_worker_error
from ..workers.pool import InFlight, WorkerPool
from ..workers.protocol import Answer, Command, Crashed, Ok
from ..workers.slots import SlotRead
from ..workers.waiting import deadline_after, remaining

__all__ = ["DecoupledState"]

logger = logging.getLogger(__name__)


class DecoupledState:
    """Per-env bookkeeping of decoupled stepping for one [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv].

    The commands themselves are the pool's: each ``send`` is a `WorkerPool.send` per
    worker (several may be queued on one worker) and ``recv`` takes answers through
    `WorkerPool.poll`, which applies crash detection and ``step_deadline`` on the pool's
    one clock.

    Args:
        env: The vector env (its public settings: spaces, ``num_envs``, ``stages``,
            ``autoreset_mode``, ``max_restarts``, ``profiler``).
        pool: Its `WorkerPool`.
        observations: Its observations (`observations.ObservationStore`).

    Attributes:
        in_flight: Global ids of envs with a command in flight.
        received: Ids returned by ``recv`` and not yet sent actions.
        ready: Results that arrived but were not returned by ``recv`` yet:
            ``(env_id, obs_item or None, reward, terminated, truncated, infos)``.
        restarted: Envs whose worker was rebuilt while they were not in flight (their
            result was received or ready): env id -> ``(fresh obs item, infos)``. Their
            next ``send`` does not reach the worker; it yields the truncated result that
            ends the episode the old process lost.
    """

    def __init__(self, env: Any, pool: WorkerPool, observations: ObservationStore) -> None:
        self.env = env
        self.pool = pool
        self.observations = observations
        self.active = False
        self.in_flight: set[int] = set()
        self.received: set[int] = set()
        self.ready: deque[tuple[int, Any, float, bool, bool, list[dict]]] = deque()
        self.restarted: dict[int, tuple[Any, list[dict]]] = {}
        # the workers decoupled stepping sent commands to (stage calls use the others)
        self._workers: dict[int, Any] = {}
        # answers `wait` took from the pool, filed by the next `recv`
        self._polled: list[tuple[Any, InFlight]] = []

    # ------------------------------------------------------------------ checks

    def check_free(self, envs: slice, op: str) -> None:
        """Refuse a stage ``op`` on envs that decoupled stepping is driving.

        A reset may take envs that were received and not sent (it ends their decoupled
        use); anything in flight must be received first.

        Raises:
            RuntimeError: Mixing ``step_*``/``reset_*`` and ``send``/``recv`` on the same envs.
        """
        if not self.active:
            return
        pending = (self.in_flight | {r[0] for r in self.ready}) & set(range(envs.start, envs.stop))
        held = self.received & set(range(envs.start, envs.stop))
        if pending or (held and op != "reset"):
            ids = sorted(pending | (held if op != "reset" else set()))
            raise RuntimeError(
                f"envs {ids} are driven by send/recv (decoupled mode); "
                f"{'recv their results' if pending else 'send their actions'} before `{op}`, "
                "or reset them once they are received"
            )
        if op == "reset":
            self.received -= held
            for g in held:
                self.restarted.pop(g, None)
            self.active = bool(self.in_flight or self.received or self.ready)

    def check_can_reset(self) -> None:
        """Refuse an ``async_reset`` while stage calls or decoupled commands are in flight.

        Raises:
            RuntimeError: A stage has a call in flight, or envs are in flight from ``send``.
        """
        stages = self.env.stages
        if any(s.busy for s in stages):
            busy = [s.index for s in stages if s.busy]
            raise RuntimeError(
                f"async_reset: stages {busy} have calls in flight; wait for them first"
            )
        if self.in_flight or self.ready:
            raise RuntimeError(
                "async_reset: envs are still in flight from send/recv; recv them first"
            )

    def drives(self, w: Any) -> bool:
        """Whether worker ``w`` has decoupled commands in flight."""
        return w.index in self._workers and not self.pool.idle([w])

    def has_results(self) -> bool:
        """Whether envs are in flight or have results not returned by ``recv`` yet."""
        return bool(self.in_flight or self.ready)

    def busy_workers(self) -> list[Any]:
        """The workers with decoupled commands in flight."""
        return self.pool.busy(list(self._workers.values()))

    def wait(self, timeout: float | None, wake_fd: int | None = None) -> tuple[bool, bool]:
        """Wait until some env result arrives (or a worker is found dead), the descriptor
        ``wake_fd`` turns readable (it is not read), or ``timeout`` seconds pass; one
        `WorkerPool.poll_or_wake`, so ``step_deadline`` and crash detection hold here as
        in ``recv`` (a worker past ``step_deadline`` is killed; its crash is read by the
        next wait). What arrived is filed, restarts and errors included, by the next
        ``recv``.

        Returns:
            ``(results, woken)``: whether an answer arrived (or one is waiting to be
            filed), and whether ``wake_fd`` was readable.
        """
        if self._polled:  # answers wait to be filed already: look, do not block
            timeout = 0.0
        done, woken = self.pool.poll_or_wake(self.busy_workers(), timeout, wake_fd)
        self._polled.extend(done)
        return bool(self._polled), woken

    # ------------------------------------------------------------------ API

    def async_reset(self, seeds: list[Any], per_env: list[dict[str, Any] | None]) -> None:
        """Send a reset of every env (checked arguments, one per env; see `check_can_reset`)."""
        env = self.env
        for w in self.pool.handles:
            requests = [(g - w.env_indices[0], seeds[g], per_env[g]) for g in w.env_indices]
            self._send(w, Command.RESET, requests, w.env_indices)
        for s in env.stages:
            s.recover()
        self.in_flight = set(range(env.num_envs))
        self.received.clear()
        self.restarted.clear()
        self.active = True

    def send(self, actions: Any, env_ids: Any) -> None:
        env = self.env
        ids = np.asarray(env_ids).reshape(-1)
        if ids.dtype.kind not in "iu":
            raise ValueError(f"env_ids: expected integer env ids, got dtype {ids.dtype}")
        id_list = [int(i) for i in ids]
        if len(set(id_list)) != len(id_list):
            raise ValueError(f"env_ids: duplicate ids in {id_list}")
        unknown = [i for i in id_list if i not in self.received]
        if unknown:
            raise ValueError(
                f"env_ids: envs {unknown} were not received by recv, or already have actions"
            )
        batch = check_actions(env.single_action_space, to_numpy(actions), len(id_list))
        space = env.single_action_space
        by_worker: dict[Any, list[int]] = {}
        for pos, g in enumerate(id_list):
            if g in self.restarted:  # its simulator is gone: this step ends the episode
                self._end_restarted_episode(g, self.restarted.pop(g))
                continue
            by_worker.setdefault(self.pool.worker_of(g), []).append(pos)
        for w, positions in by_worker.items():
            rows = _take(space, batch, positions)
            locals_ = [id_list[p] - w.env_indices[0] for p in positions]
            self._send(w, Command.STEP, (locals_, rows), [id_list[p] for p in positions])
        self.received.difference_update(id_list)
        self.in_flight.update(id_list[p] for positions in by_worker.values() for p in positions)

    def recv(self, batch_size: int | None, timeout: float | None):
        env = self.env
        if not self.active:
            raise NoAsyncCallError("recv without a prior async_reset", "recv")
        want = 1 if batch_size is None else int(batch_size)
        available = len(self.in_flight) + len(self.ready)
        if want < 1 or want > available:
            raise ValueError(
                f"batch_size: expected None or an int in [1, {available}] (envs in flight or "
                f"ready), got {batch_size!r}"
            )
        deadline = deadline_after(timeout)
        t0 = time.monotonic_ns()
        self._collect(0.0)
        while len(self.ready) < want:
            if not self._collect(remaining(deadline)):
                raise WaitTimeoutError(
                    f"recv: {len(self.ready)} of {want} env results arrived within {timeout} s; "
                    "they stay queued for the next recv"
                )
        if env.profiler.enabled:
            env.profiler.caller_waited("recv", t0)
        return self._pop_all()

    # ------------------------------------------------------------------ internals

    def _send(self, w: Any, command: Command, payload: Any, env_ids: Sequence[int]) -> None:
        self._workers[w.index] = w
        self.pool.send(w, command, payload, env_ids)

    def _collect(self, timeout: float | None) -> bool:
        """Take every answer that arrives within ``timeout`` (and those already there
        with it); False if none arrived."""
        done, self._polled = self._polled, []
        if not done:
            busy = self.busy_workers()
            if not busy:
                return True
            deadline = deadline_after(timeout)
            while True:
                done = self.pool.poll(busy, remaining(deadline))
                if done or (deadline is not None and remaining(deadline) == 0):
                    break
        got = bool(done)
        error: BaseException | None = None
        while done:
            for w, command in done:
                answer = self.pool.take(w)
                assert answer is not None
                try:
                    self._take_answer(w, command, answer)
                except BaseException as exc:  # noqa: BLE001 - raised below
                    error = error or exc
            done = self.pool.poll(self.busy_workers(), 0.0)  # the answers already there
        for index in [i for i, w in self._workers.items() if self.pool.idle([w])]:
            del self._workers[index]
        if error is not None:
            raise error
        return got

    def _take_answer(self, w: Any, command: InFlight, answer: Answer) -> None:
        """File one answer of worker ``w``: results become ready; a failure restarts the
        worker within ``max_restarts`` or is raised."""
        env = self.env
        ids = list(command.env_ids)
        self.in_flight.difference_update(ids)
        if not answer.ok and 0 < env.max_restarts and w.restarts < env.max_restarts:
            self._restart(w, answer, ids + self._drop(w))
            return
        if isinstance(answer, Crashed):
            self._drop(w)
            env.stages[w.stage].fail(w, describe_failure(w, answer))
            raise WorkerCrashedError(w.index, w.env_indices, w.exitcode)
        if not isinstance(answer, Ok):
            env.stages[w.stage].fail(w, describe_failure(w, answer))
            raise_worker_error(w, answer)
        payload = answer.payload
        self._unpack(ids, payload.read() if type(payload) is SlotRead else payload)

    def _drop(self, w: Any) -> list[int]:
        """Forget every command of ``w`` still in flight (its process is gone or about to
        be); return the ids of the envs they were for."""
        lost = [g for c in self.pool.drop(w) for g in c.env_ids]
        self.in_flight.difference_update(lost)
        return lost

    def _restart(self, w: Any, failure: Answer, lost: list[int]) -> None:
        """Rebuild worker ``w`` after ``failure`` and end its envs' episodes.

        Envs whose command was lost get a truncated result at once; the others (results
        received or ready) get it at their next ``send``. The semantics are those of
        stage stepping (``max_restarts`` in [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv]).

        Raises:
            WorkerCrashedError / the env's exception: The rebuilt worker failed to start
                or to reset.
        """
        env = self.env
        store = self.observations
        mine = set(w.env_indices)
        # results already here keep their observations: the fresh reset overwrites the rows
        kept = {e[0]: store.single(e[0]) for e in self.ready if store.shared and e[0] in mine}
        answer = self.pool.rebuild([(w, failure, "step")])[w.index]
        if not answer.ok:
            env.stages[w.stage].fail(w, describe_failure(w, answer))
            raise_worker_error(w, answer)
        items, reset_infos = answer.payload
        if env.autoreset_mode == AutoresetMode.NEXT_STEP:
            # the truncated step is followed by an autoreset step, as for any episode end
            self.pool.send(w, Command.SET_AUTORESET, list(range(len(w.env_indices))))
        for k, g in enumerate(w.env_indices):
            obs = items[k] if items is not None else store.single(g)
            infos = reset_infos[k]
            if env.autoreset_mode == AutoresetMode.SAME_STEP:
                # the simulator's last observation is lost: the fresh one stands in
                infos = [{"final_obs": obs, "final_info": {"worker_restarted": True}}, *infos]
            if g in lost:
                self.ready.append((g, None if store.shared else obs, 0.0, False, True, infos))
            else:
                self.restarted[g] = (obs, infos)
        for g, obs in kept.items():
            store.write(g, obs)

    def _end_restarted_episode(self, g: int, fresh: tuple[Any, list[dict]]) -> None:
        """Queue the truncated result of env ``g`` whose worker was rebuilt since its last
        result: reward 0, ``truncated=True``, the fresh observation."""
        obs, infos = fresh
        if self.observations.shared:
            self.observations.write(g, obs)
            obs = None
        self.ready.append((g, obs, 0.0, False, True, infos))

    def _unpack(self, ids: list[int], payload: tuple) -> None:
        if len(payload) == 2:  # reset answer: (items, infos)
            items, infos = payload
            for k, g in enumerate(ids):
                self.ready.append(
                    (g, None if items is None else items[k], 0.0, False, False, infos[k])
                )
            return
        items, rewards, terms, truncs, infos = payload
        for k, g in enumerate(ids):
            self.ready.append(
                (
                    g,
                    None if items is None else items[k],
                    float(rewards[k]),
                    bool(terms[k]),
                    bool(truncs[k]),
                    infos[k],
                )
            )

    def _pop_all(self):
        env = self.env
        store = self.observations
        entries = list(self.ready)
        self.ready.clear()
        ids = np.array([e[0] for e in entries], dtype=np.int64)
        space = env.single_observation_space
        if store.shared:
            obs = store.rows(ids)
        else:
            for e in entries:
                store.keep(e[0], e[1])
            obs = concatenate(
                space,
                [e[1] for e in entries],
                create_empty_array(space, n=len(entries), fn=np.zeros),
            )
        rewards = np.array([e[2] for e in entries], dtype=np.float64)
        terminations = np.array([e[3] for e in entries], dtype=np.bool_)
        truncations = np.array([e[4] for e in entries], dtype=np.bool_)
        infos: dict[str, Any] = {}
        for k, e in enumerate(entries):
            for info in e[5]:
                infos = merge_info(infos, info, k, len(entries))
        infos["env_id"] = ids
        infos["_env_id"] = np.ones(len(entries), dtype=np.bool_)
        self.received.update(int(i) for i in ids)
        return obs, rewards, terminations, truncations, infos


def _take(space: Any, batch: Any, positions: list[int]) -> Any:
    """The rows ``positions`` of a batch (copies for arrays; tuples for item batches)."""
    return batch_slice(space, batch, np.asarray(positions, dtype=np.int64))
