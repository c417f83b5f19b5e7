"""Decoupled stepping: EnvPool-style ``async_reset`` / ``recv`` / ``send`` over the workers.

Instead of stepping a whole stage at once, every env is an independent producer: the
caller receives the results of whichever envs are ready (``recv``), and sends actions to
any subset of the envs it received (``send``). A worker holding several envs may have
several commands queued; its answers come back in order. This is the single-consumer API
of EnvPool (Weng et al., 2022, "EnvPool: A Highly Parallel Reinforcement Learning
Environment Execution Engine"), the base that `pipelined_vec_env.channel` builds
RLinf-style multi-actor inference on.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.error import NoAsyncCallError
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array, write_to_shared_memory

from .batching import batch_slice, check_actions, to_numpy
from .errors import WaitTimeoutError, WorkerCrashedError
from .protocol import Answer, Command, Crashed, Ok
from .worker_handle import (
    WorkerHandle,
    deadline_after,
    describe_failure,
    raise_worker_error,
    remaining,
    wait_readable,
)

if TYPE_CHECKING:
    from .vector_env import PipelinedVectorEnv

__all__ = ["DecoupledState"]

logger = logging.getLogger(__name__)


class DecoupledState:
    """Per-env bookkeeping of decoupled stepping for one [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv].

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

    def __init__(self, env: PipelinedVectorEnv) -> None:
        self.env = env
        self.active = False
        self.in_flight: set[int] = set()
        self.received: set[int] = set()
        self.ready: deque[tuple[int, Any, float, bool, bool, list[dict]]] = deque()
        self.restarted: dict[int, tuple[Any, list[dict]]] = {}
        self.outstanding: dict[WorkerHandle, deque[list[int]]] = {
            w: deque() for w in env._handles
        }
        # when each worker's oldest outstanding command started (for step_deadline)
        self.head_since: dict[WorkerHandle, float] = {}

    # ------------------------------------------------------------------ checks

    def busy_envs(self, envs: slice) -> set[int]:
        """Ids in ``envs`` that are in flight or received-not-sent in decoupled mode."""
        ids = set(range(envs.start, envs.stop))
        return (self.in_flight | self.received | {r[0] for r in self.ready}) & ids

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

    # ------------------------------------------------------------------ API

    def async_reset(self, seed: Any, options: Any) -> None:
        env = self.env
        env._check_open()
        if any(s.state is not None for s in env.stages):
            busy = [s.index for s in env.stages if s.state is not None]
            raise RuntimeError(f"async_reset: stages {busy} have calls in flight; wait for them first")
        if self.in_flight or self.ready:
            raise RuntimeError(
                "async_reset: envs are still in flight from send/recv; recv them first"
            )
        seeds, per_env, mask = env._reset_arguments(seed, options, slice(0, env.num_envs))
        if not mask.all():
            raise ValueError("async_reset: options['reset_mask'] is not supported; reset all envs")
        env._revive_dead_workers(list(env.stages), mask, slice(0, env.num_envs))
        for w in env._handles:
            requests = [(g - w.env_indices[0], seeds[g], per_env[g]) for g in w.env_indices]
            w.send(Command.RESET, requests, expect_answer=False)
            self.outstanding[w].append(list(w.env_indices))
            self.head_since[w] = time.monotonic()
        for s in env.stages:
            s.recover()
        self.in_flight = set(range(env.num_envs))
        self.received.clear()
        self.restarted.clear()
        self.active = True

    def send(self, actions: Any, env_ids: Any) -> None:
        env = self.env
        env._check_open()
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
        by_worker: dict[WorkerHandle, list[int]] = {}
        for pos, g in enumerate(id_list):
            if g in self.restarted:  # its simulator is gone: this step ends the episode
                self._end_restarted_episode(g, self.restarted.pop(g))
                continue
            by_worker.setdefault(env._pool.worker_of(g), []).append(pos)
        for w, positions in by_worker.items():
            rows = _take(space, batch, positions)
            locals_ = [id_list[p] - w.env_indices[0] for p in positions]
            w.send(Command.STEP, (locals_, rows), expect_answer=False)
            if not self.outstanding[w]:
                self.head_since[w] = time.monotonic()
            self.outstanding[w].append([id_list[p] for p in positions])
        self.received.difference_update(id_list)
        self.in_flight.update(id_list[p] for positions in by_worker.values() for p in positions)

    def recv(self, batch_size: int | None, timeout: float | None):
        env = self.env
        env._check_open()
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

    def _collect(self, timeout: float | None) -> bool:
        """Receive every answer readable within ``timeout``; False if none arrived."""
        busy = [w for w, queue in self.outstanding.items() if queue]
        if not busy:
            return True
        got = False
        error: BaseException | None = None
        deadline = deadline_after(timeout)
        while True:
            workers = wait_readable(busy, self.wait_before(busy, deadline))
            if workers:
                break
            if self.kill_overdue(busy):
                continue  # their sentinels turn readable: read the crash
            if deadline is not None and remaining(deadline) == 0:
                break
        for w in workers:
            while self.outstanding[w]:
                if w.conn.poll(0):
                    try:
                        answer = w.recv_answer()
                    except (EOFError, OSError):
                        w._mark_dead()
                        answer = Crashed(w.process.exitcode)
                elif not w.process.is_alive():
                    w._mark_dead()
                    answer = Crashed(w.process.exitcode)
                else:
                    break
                got = True
                if not answer.ok and 0 < self.env.max_restarts and w.restarts < self.env.max_restarts:
                    try:
                        self._restart(w, answer, self._drop_outstanding(w))
                    except BaseException as exc:  # noqa: BLE001 - raised below
                        error = error or exc
                    break
                if isinstance(answer, Crashed):
                    self._drop_outstanding(w)
                    self.env.stages[w.stage].fail(w, describe_failure(w, answer))
                    error = error or WorkerCrashedError(w.index, w.env_indices, w.process.exitcode)
                    break
                ids = self.outstanding[w].popleft()
                self.head_since[w] = time.monotonic()  # the next queued command runs now
                self.in_flight.difference_update(ids)
                if not isinstance(answer, Ok):
                    self.env.stages[w.stage].fail(w, describe_failure(w, answer))
                    try:
                        raise_worker_error(w, answer)
                    except BaseException as exc:  # noqa: BLE001 - raised below
                        error = error or exc
                    continue
                self._unpack(ids, answer.payload)
        if error is not None:
            raise error
        return got

    def _drop_outstanding(self, w: WorkerHandle) -> list[int]:
        """Forget every command of ``w`` still outstanding (its process is gone or about
        to be); return the ids of the envs they were for."""
        lost = [g for q in self.outstanding[w] for g in q]
        self.outstanding[w].clear()
        self.in_flight.difference_update(lost)
        return lost

    def wait_before(self, busy: list[WorkerHandle], deadline: float | None) -> float | None:
        """Seconds to wait now for ``busy``: until the caller's ``deadline`` (a
        ``time.monotonic()`` value or None) or the first ``step_deadline`` overrun."""
        wait = remaining(deadline)
        overdue_at = self.overdue_at(busy)
        if overdue_at is not None:
            left = max(0.0, overdue_at - time.monotonic())
            wait = left if wait is None else min(wait, left)
        return wait

    def overdue_at(self, busy: list[WorkerHandle]) -> float | None:
        """The ``time.monotonic()`` at which the first of ``busy`` overruns ``step_deadline``
        with its oldest outstanding command (None: no deadline, or all already killed)."""
        limit = self.env.step_deadline
        if limit is None:
            return None
        times = [self.head_since[w] + limit for w in busy if not w.deadline_exceeded]
        return min(times) if times else None

    def kill_overdue(self, busy: list[WorkerHandle]) -> bool:
        """Kill the workers of ``busy`` past ``step_deadline``; their crash is then read
        like any other (restart or error). Return whether any was killed."""
        limit = self.env.step_deadline
        if limit is None:
            return False
        now = time.monotonic()
        killed = False
        for w in busy:
            if not w.deadline_exceeded and now >= self.head_since[w] + limit:
                logger.warning("worker %d overran step_deadline=%.3g s; killing it", w.index, limit)
                w.kill_for_deadline()
                killed = True
        return killed

    def _restart(self, w: WorkerHandle, failure: Answer, lost: list[int]) -> None:
        """Rebuild worker ``w`` after ``failure`` and end its envs' episodes.

        Envs whose command was lost get a truncated result at once; the others (results
        received or ready) get it at their next ``send``. The semantics are those of
        stage stepping (``max_restarts`` in [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv]).

        Raises:
            WorkerCrashedError / the env's exception: The rebuilt worker failed to start
                or to reset.
        """
        env = self.env
        shm = env._buffers is not None
        mine = set(w.env_indices)
        # results already here keep their observations: the fresh reset overwrites the rows
        kept = {e[0]: env._single_obs(e[0]) for e in self.ready if shm and e[0] in mine}
        answer = env._pool.rebuild(w, failure, "step")
        if not answer.ok:
            self.env.stages[w.stage].fail(w, describe_failure(w, answer))
            raise_worker_error(w, answer)
        items, reset_infos = answer.payload
        if env.autoreset_mode == AutoresetMode.NEXT_STEP:
            # the truncated step is followed by an autoreset step, as for any episode end
            w.send(Command.SET_AUTORESET, list(range(len(w.env_indices))), expect_answer=False)
        for k, g in enumerate(w.env_indices):
            obs = items[k] if items is not None else env._single_obs(g)
            infos = reset_infos[k]
            if env.autoreset_mode == AutoresetMode.SAME_STEP:
                # the simulator's last observation is lost: the fresh one stands in
                infos = [{"final_obs": obs, "final_info": {"worker_restarted": True}}, *infos]
            if g in lost:
                self.ready.append((g, None if shm else obs, 0.0, False, True, infos))
            else:
                self.restarted[g] = (obs, infos)
        for g, obs in kept.items():
            write_to_shared_memory(env.single_observation_space, g, obs, env._buffers)

    def _end_restarted_episode(self, g: int, fresh: tuple[Any, list[dict]]) -> None:
        """Queue the truncated result of env ``g`` whose worker was rebuilt since its last
        result: reward 0, ``truncated=True``, the fresh observation."""
        obs, infos = fresh
        if self.env._buffers is not None:
            write_to_shared_memory(self.env.single_observation_space, g, obs, self.env._buffers)
            obs = None
        self.ready.append((g, obs, 0.0, False, True, infos))

    def _unpack(self, ids: list[int], payload: tuple) -> None:
        if len(payload) == 2:  # reset answer: (items, infos)
            items, infos = payload
            for k, g in enumerate(ids):
                self.ready.append((g, None if items is None else items[k], 0.0, False, False, infos[k]))
            return
        items, rewards, terms, truncs, infos = payload
        for k, g in enumerate(ids):
            self.ready.append(
                (g, None if items is None else items[k], float(rewards[k]), bool(terms[k]), bool(truncs[k]), infos[k])
            )

    def _pop_all(self):
        from .vector_env import _InfoBatch

        env = self.env
        entries = list(self.ready)
        self.ready.clear()
        ids = np.array([e[0] for e in entries], dtype=np.int64)
        space = env.single_observation_space
        if env._buffers is not None:
            view = env._shared_view()
            obs = _take(space, view, list(ids))
        else:
            for e in entries:
                env._env_obs[e[0]] = e[1]
            obs = concatenate(
                space, [e[1] for e in entries], create_empty_array(space, n=len(entries), fn=np.zeros)
            )
        rewards = np.array([e[2] for e in entries], dtype=np.float64)
        terminations = np.array([e[3] for e in entries], dtype=np.bool_)
        truncations = np.array([e[4] for e in entries], dtype=np.bool_)
        infos: dict[str, Any] = {}
        batcher = _InfoBatch(len(entries))
        for k, e in enumerate(entries):
            for info in e[5]:
                infos = batcher._add_info(infos, info, k)
        infos["env_id"] = ids
        infos["_env_id"] = np.ones(len(entries), dtype=np.bool_)
        self.received.update(int(i) for i in ids)
        return obs, rewards, terminations, truncations, infos


def _take(space: Any, batch: Any, positions: list[int]) -> Any:
    """The rows ``positions`` of a batch (copies for arrays; tuples for item batches)."""
    return batch_slice(space, batch, np.asarray(positions, dtype=np.int64))
