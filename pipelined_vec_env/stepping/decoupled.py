"""Decoupled stepping: EnvPool-style ``async_reset`` / ``recv`` / ``send`` over the workers.

Instead of stepping a whole stage at once, every env is an independent producer: the
caller receives the results of whichever envs are ready (``recv``), and sends actions to
any subset of the envs it received (``send``). A worker holding several envs may have
several commands queued; its answers come back in order, except for a worker that steps
its envs concurrently, which is sent one `Command.STEP_ENV` per env and answers each env
as soon as it stepped (`_step_commands`). This is the single-consumer API
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

from ..batching import check_actions, to_numpy
from ..errors import ObservationError, WaitTimeoutError, WorkerCrashedError
from ..observations import ObservationStore
from ..workers.failures import describe_failure, raise_worker_error
from ..workers.pool import InFlight, WorkerPool
from ..workers.process_backend import ProcessBackend
from ..workers.protocol import Answer, Command, Crashed, Ok, StepRequest
from ..workers.slots import SlotRead, all_true, read_step
from ..workers.spinning import SpinGate, hand_over_core
from ..workers.waiting import deadline_after, remaining
from .ready_results import ReadyResults, joined, joined_infos, rows_of

__all__ = ["DecoupledState"]

#: What ``recv`` returns: ``(observations, rewards, terminations, truncations, infos)``.
Results = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]

logger = logging.getLogger(__name__)

#: The longest running mean of the decoupled steps' round trips (seconds, from when a
#: step's worker could start it to the ``recv`` that takes its answer) under which a slot
#: lane ``send`` hands the caller's core to the workers (`spinning.hand_over_core`). The
#: caller then waits behind a worker on its core, up to about one scheduler slice (a
#: millisecond or so on Linux), so only where steps are that quick: HalfCheetah's 4-env
#: steps (~0.2 ms), not LIBERO's (tens of ms).
HAND_OVER_SECONDS = 1e-3


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
        ready: Results that arrived but were not returned by ``recv`` yet, one
            `ReadyResults` per answer (or per env for a restart's results).
        ready_count: How many envs ``ready`` holds.
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
        self.ready: deque[ReadyResults] = deque()
        self.ready_count = 0
        self.restarted: dict[int, tuple[Any, list[dict]]] = {}
        # the workers decoupled stepping sent commands to (stage calls use the others)
        self._workers: dict[int, Any] = {}
        # answers `wait` took from the pool, filed by the next `recv`
        self._polled: list[tuple[Any, InFlight]] = []
        # global env id -> its worker (made at the first send: the pool's handles by then)
        self._owner: list[Any] = []
        # whether the slot lane may serve recv/send (`_lane_recv`): subprocess workers
        self._lane = isinstance(pool.backend, ProcessBackend)
        # the steps' round trips, from when a worker could start each to the recv that
        # took its answer: their running mean (`SpinGate.mean`) gates the hand-over
        self._round_trips = SpinGate(HAND_OVER_SECONDS)

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
        """Send a reset of every env (checked arguments, one per env; see
        `decoupled_guards.check_can_reset`)."""
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
        id_list: list[int] = ids.tolist()
        if len(set(id_list)) != len(id_list):
            raise ValueError(f"env_ids: duplicate ids in {id_list}")
        if not self.received.issuperset(id_list):
            unknown = [i for i in id_list if i not in self.received]
            raise ValueError(
                f"env_ids: envs {unknown} were not received by recv, or already have actions"
            )
        batch = check_actions(env.single_action_space, to_numpy(actions), len(id_list))
        if self._lane_send(batch, id_list):
            sent = id_list
        else:
            sent = []
            for w, positions in self._by_worker(id_list):
                self._send_step(w, batch, positions, id_list)
                sent.extend(id_list[p] for p in positions)
        self.received.difference_update(id_list)
        self.in_flight.update(sent)

    def _by_worker(self, id_list: list[int]) -> list[tuple[Any, list[int]]]:
        """The positions in ``id_list`` of each worker's envs (ids in runs of one worker
        keep their order); envs whose worker was rebuilt get their truncated result
        instead (`_end_restarted_episode`)."""
        owner, restarted = self._owners(), self.restarted
        groups: dict[int, tuple[Any, list[int]]] = {}
        for pos, g in enumerate(id_list):
            if restarted and g in restarted:  # its simulator is gone: this step ends it
                self._end_restarted_episode(g, restarted.pop(g))
                continue
            w = owner[g]
            group = groups.get(w.index)
            if group is None:
                groups[w.index] = (w, [pos])
            else:
                group[1].append(pos)
        return list(groups.values())

    def _owners(self) -> list[Any]:
        """Per global env id, its worker (made at the first send: the pool's handles by then)."""
        if not self._owner:
            owner: list[Any] = [None] * self.env.num_envs
            for w in self.pool.handles:
                for g in w.env_indices:
                    owner[g] = w
            self._owner = owner
        return self._owner

    def _send_step(self, w: Any, batch: Any, positions: list[int], id_list: list[int]) -> None:
        """Send worker ``w`` the step of the envs ``id_list[p]`` for ``p`` in ``positions``
        (their actions: those rows of ``batch``), as `_step_commands` says."""
        space = self.env.single_action_space
        for command, payload, ids in _step_commands(space, w, batch, positions, id_list):
            self._send(w, command, payload, ids)

    def recv(self, batch_size: int | None, timeout: float | None) -> Results:
        env = self.env
        if not self.active:
            raise NoAsyncCallError("recv without a prior async_reset", "recv")
        want = 1 if batch_size is None else int(batch_size)
        available = len(self.in_flight) + self.ready_count
        if want < 1 or want > available:
            raise ValueError(
                f"batch_size: expected None or an int in [1, {available}] (envs in flight or "
                f"ready), got {batch_size!r}"
            )
        deadline = deadline_after(timeout)
        if self._lane and not (self.ready or self._polled):
            results = self._lane_recv(want, deadline)
            if results is not None:
                return results
        t0 = time.monotonic_ns()
        if self.ready_count >= want:  # enough already: take what else is there, no wait
            self._collect(0.0, look=True)
        # else the first `_collect` below returns at once with what is there already
        while self.ready_count < want:
            if not self._collect(remaining(deadline)):
                raise WaitTimeoutError(
                    f"recv: {self.ready_count} of {want} env results arrived within {timeout} s; "
                    "they stay queued for the next recv"
                )
        if env.profiler.enabled:
            env.profiler.caller_waited("recv", t0)
        return self._pop_all()

    # ------------------------------------------------------------------ slot lane

    def _lane_send(self, batch: Any, id_list: list[int]) -> bool:
        """Send the actions ``batch`` (checked) of the envs ``id_list`` as whole-worker
        steps through the slots, when ``id_list`` is a run of whole workers' envs, each
        worker's in order, with nothing in flight on them, and each worker's rows fit its
        slot: one `WorkerPool.send` per worker of its rows (a view: the slot takes a copy).
        False, with nothing sent, otherwise (the general path serves the call).

        Then, while lane round trips are quick (`HAND_OVER_SECONDS`) and no answer waits,
        it hands the caller's core over as a whole-env step does
        (`spinning.hand_over_core`): a worker spinning on that core for its next step
        starts it at once, and the caller, back after it, finds answers written instead
        of sleeping until a pipe write wakes it (measured: docs/benchmarks_costs.md)."""
        if not self._lane or self.restarted or type(batch) is not np.ndarray:
            return False
        owner, pool = self._owners(), self.pool
        groups = []
        pos, n = 0, len(id_list)
        while pos < n:
            w = owner[id_list[pos]]
            envs = w.env_indices
            k = len(envs)
            rows = batch[pos : pos + k]
            slot = w.slot
            if (
                tuple(id_list[pos : pos + k]) != envs
                or slot is None
                or (k > 1 and slot.worker_concurrent())  # one command per env instead
                or not pool.idle([w])
                or not slot.accepts(rows, k)
            ):
                return False
            groups.append((w, rows))
            pos += k
        for w, rows in groups:
            self._send(w, Command.STEP, StepRequest(None, rows), w.env_indices)
        if self._round_trips.mean < HAND_OVER_SECONDS and pool.backend.none_written(
            self.busy_workers()
        ):
            # quick steps and no answer to take: a worker sharing this core starts now,
            # and the caller finds its answer written when it gets the core back
            hand_over_core(pool.profiler)
        return True

    def _lane_recv(self, want: int, deadline: float | None) -> Results | None:
        """``recv`` of whole-worker steps answered through the slots: wait for at least
        ``want`` envs' answers on the workers' pipes (`ProcessBackend.written`), receive
        every answer already written, and join their results straight from the slots
        (`slots.read_step`: one copy per array), the observations from shared memory.

        Serves only when no answer waits to be filed, every worker in flight has a slot
        and steps all its envs, and observations are in shared memory. Returns None
        otherwise, and when a worker ends, a deadline or ``deadline`` passes or an answer is
        no fast step's: the general path then takes over from where this stopped (what
        was received is filed as ready results first)."""
        pool = self.pool
        if not self.observations.shared:
            return None
        profiler = pool.profiler  # None when profiling is off
        t0 = time.monotonic_ns() if profiler is not None else 0
        busy = pool.busy(list(self._workers.values()))
        if not busy:
            return None
        for w in busy:
            head = pool.in_flight(w)[0]
            if (
                w.slot is None
                or w.answer is not None
                or w.deadline_exceeded  # killed: the general wait reads its crash
                or head.command != Command.STEP
                or head.env_ids != w.env_indices
            ):
                return None
        # every call enforces step_deadline, answers already there or not (0: a kill)
        if pool.step_deadline is not None and pool.enforce_deadlines(busy, None) == 0:
            return None
        written = ProcessBackend.written(busy, 0)
        while sum(len(w.env_indices) for w in written) < want:
            wait = pool.enforce_deadlines(busy, remaining(deadline))
            rest = [w for w in busy if w not in written]
            more = None if wait == 0 or not rest else ProcessBackend.written(rest, wait)
            if not more:  # a worker ended, an overrun or the timeout: the general path
                return None
            written.extend(more)
            # and every answer that came meanwhile: a recv returns all that is ready
            written.extend(w for w in rest if w not in more and w.answer_waiting())
        if profiler is not None:  # the wait for the answers, not their join
            profiler.caller_waited("recv", t0)
        return self._lane_take(written)

    def _lane_take(self, written: list[Any]) -> Results | None:
        """Receive the answers of the workers ``written`` (each in its pipe) and return
        their envs' results joined from the slots, as `recv` returns them. From the first
        answer that is not a fast step's on, every answer is filed as the general path
        files it (the fast ones before it too), errors raised once all are filed; None is
        returned then, and `recv` goes on from the ready results."""
        pool = self.pool
        reads: list[tuple[SlotRead, tuple[int, ...]]] = []
        general = False
        error: BaseException | None = None
        try:
            for w in written:
                if w.answer is None:  # else `ProcessBackend.written` read it as it came
                    w.receive()
                answer = w.take()
                command = pool.finish(w)
                self._note_round_trip(command)
                if pool.idle([w]):
                    self._workers.pop(w.index, None)
                if not general and type(answer) is Ok and type(answer.payload) is SlotRead:
                    reads.append((answer.payload, command.env_ids))
                    continue
                if not general:
                    general = True
                    self._file_reads(reads)
                    reads = []
                try:
                    self._take_answer(w, command, answer)
                except BaseException as exc:  # noqa: BLE001 - raised below, once all are filed
                    error = error or exc
        except BaseException:  # reading an answer failed: what was read stays ready
            self._file_reads(reads)
            raise
        if error is not None:
            raise error
        if general:
            return None
        ids = [g for _, envs in reads for g in envs]
        batch = read_step([r for r, _ in reads], len(ids))
        if batch is None:  # infos of several kinds or layouts: joined key by key
            self._file_reads(reads)
            return self._pop_all()
        self.in_flight.difference_update(ids)
        rewards, terminations, truncations, infos = batch
        index = np.array(ids, dtype=np.int64)
        infos["env_id"] = index
        infos["_env_id"] = all_true((len(ids),))
        self.received.update(ids)
        return self.observations.rows(index), rewards, terminations, truncations, infos

    def _note_round_trip(self, command: InFlight) -> None:
        """Record the round trip of ``command`` (a step or reset whose answer was just
        taken), from when its worker could start it (`HAND_OVER_SECONDS`)."""
        self._round_trips.record(time.monotonic() - command.sent_at)

    def _file_reads(self, reads: list[tuple[SlotRead, tuple[int, ...]]]) -> None:
        """Queue the results of fast answers ``reads`` (``(read, env ids)``) as ready."""
        for read, envs in reads:
            self.in_flight.difference_update(envs)
            self._unpack(list(envs), read.read())

    # ------------------------------------------------------------------ internals

    def _send(self, w: Any, command: Command, payload: Any, env_ids: Sequence[int]) -> None:
        self._workers[w.index] = w
        self.observations.begin_first(env_ids)
        self.pool.send(w, command, payload, env_ids)

    def _collect(self, timeout: float | None, look: bool = False) -> bool:
        """Take every answer that arrives within ``timeout`` (and those already there
        with it); False if none arrived. With ``look``, only those already written, found
        without a system call where the slots tell (a crash is then left to the next
        wait, which a look must not replace: a caller polling ``recv(timeout=0)`` learns
        of a dead worker)."""
        pool = self.pool
        done, self._polled = self._polled, []
        if not done:
            busy = self.busy_workers()
            if not busy:
                return True
            if look:
                done = pool.poll_written(busy)
            else:
                deadline = deadline_after(timeout)
                while True:
                    done = pool.poll(busy, remaining(deadline))
                    if done or (deadline is not None and remaining(deadline) == 0):
                        break
        got = bool(done)
        error: BaseException | None = None
        while done:
            for w, command in done:
                answer = pool.take(w)
                assert answer is not None
                self._note_round_trip(command)
                try:
                    self._take_answer(w, command, answer)
                except BaseException as exc:  # noqa: BLE001 - raised below
                    error = error or exc
                if pool.idle([w]):  # only a worker that answered can have become idle
                    self._workers.pop(w.index, None)
            done = pool.poll_written(self.busy_workers())  # the answers already there
        if error is not None:
            raise error
        return got

    def _take_answer(self, w: Any, command: InFlight, answer: Answer) -> None:
        """File one answer of worker ``w``: results become ready; a failure restarts the
        worker within ``max_restarts`` or is raised. An `ObservationError`'s results of
        the worker's other envs become ready before it is raised (`_file_fitting`)."""
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
            try:
                raise_worker_error(w, answer)
            except ObservationError as error:
                self._file_fitting(ids, error)
                raise
        payload = answer.payload
        self._unpack(ids, payload.read() if type(payload) is SlotRead else payload)

    def _file_fitting(self, ids: list[int], error: ObservationError) -> None:
        """Queue the results of the envs ``ids`` (one answer's) whose observations fit,
        which ``error`` carries (taken from it): the worker wrote their observations, and
        they go on with ``send``; the envs ``error.env_indices`` leave the decoupled flow
        until a reset, as a failed worker's envs do."""
        results, error.worker_results = error.worker_results, None
        keep = [k for k, g in enumerate(ids) if g not in error.env_indices]
        if results is None or not keep:
            return
        items, infos = results[0], results[-1]
        if items is not None:  # through the pipe: the fitting envs' items only
            items = items if len(items) == len(keep) else [items[k] for k in keep]
        infos = [infos[k] for k in keep]
        if len(results) == 2:  # a reset's
            self._unpack([ids[k] for k in keep], (items, infos))
            return
        rewards, terminations, truncations = (np.asarray(a)[keep] for a in results[1:4])
        self._unpack([ids[k] for k in keep], (items, rewards, terminations, truncations, infos))

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
        kept = {g: store.single(g) for r in self.ready if store.shared for g in r.ids if g in mine}
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
                self._append_one(g, None if store.shared else obs, infos)
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
        self._append_one(g, obs, infos)

    def _append_one(self, g: int, obs: Any, infos: list[dict]) -> None:
        """Queue env ``g``'s truncated result (reward 0) with ``obs`` (None: in the store)."""
        self.ready.append(
            ReadyResults([g], None if obs is None else [obs], _ZERO, _FALSE, _TRUE, [infos])
        )
        self.ready_count += 1

    def _unpack(self, ids: list[int], payload: tuple) -> None:
        """Queue one answer's results (a reset's ``(items, infos)`` or a step's
        ``(items, rewards, terminations, truncations, infos)``) for the envs ``ids``."""
        n = len(ids)
        if len(payload) == 2:  # reset answer: (items, infos)
            items, infos = payload
            rewards, terms, truncs = np.zeros(n), np.zeros(n, np.bool_), np.zeros(n, np.bool_)
        else:
            items, rewards, terms, truncs, infos = payload
        self.ready.append(ReadyResults(ids, items, rewards, terms, truncs, infos))
        self.ready_count += n

    def _pop_all(self) -> Results:
        env = self.env
        store = self.observations
        chunks = list(self.ready)
        self.ready.clear()
        n, self.ready_count = self.ready_count, 0
        ids = np.array([g for c in chunks for g in c.ids], dtype=np.int64)
        space = env.single_observation_space
        if store.shared:
            obs = store.rows(ids)
        else:
            items = [item for c in chunks for item in c.items]
            for g, item in zip(ids.tolist(), items, strict=True):
                store.keep(g, item)
            obs = concatenate(space, items, create_empty_array(space, n=n, fn=np.zeros))
        rewards = joined([c.rewards for c in chunks], np.float64)
        terminations = joined([c.terminations for c in chunks], np.bool_)
        truncations = joined([c.truncations for c in chunks], np.bool_)
        infos = joined_infos(chunks, n)
        infos["env_id"] = ids
        infos["_env_id"] = all_true((n,))
        self.received.update(ids.tolist())
        return obs, rewards, terminations, truncations, infos


def _steps_concurrently(w: Any) -> bool:
    """Whether worker ``w`` said (in its slot) that it steps its several envs
    concurrently: decoupled stepping then sends it one `Command.STEP_ENV` per env. Workers
    without a slot (Ray, ``fast_path=False``, actions of no fixed layout) never say so:
    their envs sent together are answered together."""
    slot = getattr(w, "slot", None)  # a Ray actor has none
    return slot is not None and len(w.env_indices) > 1 and slot.worker_concurrent()


def _step_commands(
    space: Any, w: Any, batch: Any, positions: list[int], id_list: list[int]
) -> list[tuple[Command, Any, tuple[int, ...]]]:
    """The commands ``(command, payload, env ids)`` that step the envs ``id_list[p]``
    (``p`` in ``positions``) of worker ``w`` with the rows ``p`` of ``batch`` (checked
    actions of ``space``): one `Command.STEP` of them all, or, to a worker that steps its
    envs concurrently (`_steps_concurrently`), one `Command.STEP_ENV` per env. The
    worker starts each as it reads it and answers each as soon as that env stepped, so
    ``recv`` gets a worker's envs in the order they finish, as with one env per worker."""
    plain = type(batch) is np.ndarray
    base = w.env_indices[0]
    if _steps_concurrently(w):
        return [
            (
                Command.STEP_ENV,
                (
                    id_list[p] - base,
                    batch[p : p + 1].copy() if plain else rows_of(space, batch, [p]),
                ),
                (id_list[p],),
            )
            for p in positions
        ]
    first, count = positions[0], len(positions)
    if positions[-1] - first + 1 == count and plain:
        rows = batch[first : first + count].copy()  # a run of rows: one slice
    else:
        rows = rows_of(space, batch, positions)
    ids = tuple(id_list[p] for p in positions)
    locals_: list[int] | None = [g - base for g in ids]
    if count == len(w.env_indices) and locals_ == list(range(count)):
        locals_ = None  # every env of the worker in order, as a whole-env step
    return [(Command.STEP, StepRequest(locals_, rows), ids)]


_ZERO = np.zeros(1)
_FALSE = np.zeros(1, dtype=np.bool_)
_TRUE = np.ones(1, dtype=np.bool_)
