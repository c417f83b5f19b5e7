"""Decoupled inference: env workers post to a shared channel; several actors batch and reply.

Each worker process of a [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] is an
independent producer: whenever some of its envs finish a step, the driving thread posts
them to the channel as one *env batch*. Any idle inference actor (a thread with its own
policy replica or device) takes one or more posted env batches, runs its policy on them
as one batch, and the driving thread sends each action back to the env that asked for
it. Nothing ties an env worker to an actor, so a slow simulator step holds up only its
own env, not a whole synchronous batch.

This is RLinf's env decoupled mode (``runner.enable_decoupled_mode``, with its
``rollout_queue_size``) built on the EnvPool-style ``async_reset`` / ``recv`` / ``send``
of [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv], with Sample Factory's dynamic
batching (Petrenko et al., 2020, "Sample Factory: Egocentric 3D Control from Pixels at
100000 FPS with Asynchronous Reinforcement Learning"): an actor waits at most
``max_wait`` seconds for more requests after the first one, then runs what it has.
Unlike RLinf it works with any number of pipeline stages (every worker is a producer of
its own) and no wait ever blocks past its deadline.

What a run records and returns (`Transition`, `EnvTrajectory`, `DecoupledRollout`) is
[`rollout_records`][pipelined_vec_env.stepping.rollout_records]'s, its names importable from
here too.

Threads, not processes: the driving thread is the single consumer of ``envs.recv`` /
``envs.send``; actors only see observations and return actions. A policy that spends
its time in a GPU kernel or in torch/numpy code that releases the GIL runs in parallel
with the driver and with the other actors.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..batching import batch_slice, concat_batches
from ..errors import WaitTimeoutError
from ..infos import split_infos
from ..workers.waiting import deadline_after, remaining
from .actors import ActorStats, InferenceActors, Policy, Request, take_requests
from .rollout_records import DecoupledRollout, EnvTrajectory, RunState, Transition, trajectory

if TYPE_CHECKING:
    from ..vector_env import PipelinedVectorEnv

__all__ = [
    "ActorStats",
    "DecoupledRollout",
    "EnvTrajectory",
    "InferenceChannel",
    "Policy",
    "Transition",
    "take_requests",
]

logger = logging.getLogger(__name__)


class InferenceChannel:
    """A channel between the workers of a [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] and inference actors.

    The calling thread drives the run ([`reset`][pipelined_vec_env.stepping.channel.InferenceChannel.reset], [`run`][pipelined_vec_env.stepping.channel.InferenceChannel.run]); it alone calls
    ``envs.recv`` / ``envs.send``. Each policy runs in its own daemon thread (an actor).
    Whenever envs of one worker finish a step, their observations are posted as one env
    batch; an idle actor takes up to ``rollout_queue_size`` env batches (waiting at most
    ``max_wait`` seconds after the first for more), runs its policy on them as one batch,
    and the driver routes each action back to the env it belongs to.

    Each env takes exactly ``steps_per_env`` steps per [`run`][pipelined_vec_env.stepping.channel.InferenceChannel.run], at its own pace, so a
    run's per-env trajectories are what a synchronous loop of ``steps_per_env`` steps
    would produce for a policy that decides per observation (see [`run`][pipelined_vec_env.stepping.channel.InferenceChannel.run]). Between
    runs every env waits with its latest observation; the next run continues from it.

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from pipelined_vec_env import PipelinedVectorEnv
        >>> from pipelined_vec_env.stepping.channel import InferenceChannel
        >>> envs = PipelinedVectorEnv(
        ...     [lambda: gym.make("CartPole-v1") for _ in range(4)], envs_per_worker=2
        ... )  # 2 workers: one per actor, whatever the cores
        >>> def policy(obs, env_ids):
        ...     return (obs[:, 2] > 0).astype(np.int64)
        >>> with InferenceChannel(envs, [policy, policy]) as channel:
        ...     channel.reset(seed=0)
        ...     rollout = channel.run(steps_per_env=8)
        >>> rollout.steps.tolist(), rollout.trajectories[3].rewards.shape
        ([8, 8, 8, 8], (8,))
        >>> envs.close()

    Args:
        envs: The vector env. Its worker processes are the producers; stages do not
            matter (any ``num_stages``).
        policies: One policy per actor (see `Policy`), each a replica on its own
            device or sharing one thread-safe model.
        rollout_queue_size: Most env batches an actor merges into one policy call; 0 means
            ``ceil(env workers / actors)``. Small values cut waiting; large ones fill
            batches.
        max_wait: Seconds an actor waits for more env batches after taking the first,
            before running a partial batch. 0 takes only what is already queued.
        name: A name for the actor threads (``"{name}-actor-{i}"``).

    Raises:
        ValueError: No policies, more actors than env workers, a negative
            ``rollout_queue_size`` or ``max_wait``.
    """

    def __init__(
        self,
        envs: PipelinedVectorEnv,
        policies: Sequence[Policy],
        *,
        rollout_queue_size: int = 0,
        max_wait: float = 0.0,
        name: str = "inference",
    ) -> None:
        policies = list(policies)
        if not policies or not all(callable(p) for p in policies):
            raise ValueError("policies: expected a non-empty sequence of callables, one per actor")
        workers = [w for stage in envs.stages for w in stage.workers]
        if len(policies) > len(workers):
            raise ValueError(
                f"policies: {len(policies)} actors but only {len(workers)} env workers; every "
                "actor needs at least one env worker to serve. Use at most "
                f"{len(workers)} actors, or more workers (lower envs_per_worker)"
            )
        if not isinstance(rollout_queue_size, (int, np.integer)) or rollout_queue_size < 0:
            raise ValueError(
                f"rollout_queue_size: expected an int >= 0 (0: default), got {rollout_queue_size!r}"
            )
        if not isinstance(max_wait, (int, float)) or not max_wait >= 0 or math.isinf(max_wait):
            raise ValueError(f"max_wait: expected finite seconds >= 0, got {max_wait!r}")
        self.envs = envs
        self.num_actors = len(policies)
        self.num_workers = len(workers)
        self.rollout_queue_size = int(rollout_queue_size) or -(-self.num_workers // self.num_actors)
        self.max_wait = float(max_wait)
        self._worker_of = np.empty(envs.num_envs, dtype=np.int64)
        for k, w in enumerate(workers):
            self._worker_of[list(w.env_indices)] = k
        self._epoch = 0
        self._held: dict[int, Any] = {}  # env id -> latest obs (batch of one), not yet posted
        self._at_env: set[int] = set()  # envs whose step (or reset) is in flight
        self._broken: BaseException | None = None
        self._started = False
        self.closed = False
        self._actors = InferenceActors(
            policies,
            envs.single_observation_space,
            batch_limit=self.rollout_queue_size,
            max_wait=self.max_wait,
            name=name,
        )

    def _wait_for_events(
        self, envs: PipelinedVectorEnv, timeout: float | None
    ) -> tuple[bool, bool]:
        """Sleep until an env worker with commands in flight answers (or dies) or an actor
        wakes the driver; return ``(env_ready, woken)``, both False on timeout.

        One wait on the env workers and the wake pipe together: the decoupled layer's
        `DecoupledState.wait`, on the pool's poll, so a worker past the env's
        ``step_deadline`` is killed here too (its crash is then read by ``envs.recv``,
        which restarts it or raises) and a hung simulator cannot stall a run.
        """
        deadline = deadline_after(timeout)
        t0 = time.monotonic_ns()
        while True:
            env_ready, woken = envs.decoupled.wait(remaining(deadline), self._actors.wake_fd)
            if env_ready or woken:
                if envs.profiler.enabled:  # the driver idled, waiting for envs or actors
                    envs.profiler.caller_waited("channel wait", t0)
                return env_ready, woken
            if deadline is not None and remaining(deadline) == 0:
                return False, False

    # ------------------------------------------------------------------ driver

    def reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Reset every env (``envs.async_reset``); the next [`run`][pipelined_vec_env.stepping.channel.InferenceChannel.run] starts from there.

        Results still in flight from a failed run are received and dropped first, and
        requests still queued are discarded, so a channel is reusable after an error that
        left its env workers alive.

        Args:
            seed: As for ``envs.reset`` (int: env ``i`` gets ``seed + i``).
            options: As for ``envs.reset`` (no ``reset_mask``).
            timeout: Seconds to wait for steps still in flight; None waits as long as the
                workers are alive.

        Raises:
            RuntimeError: The channel is closed.
            WaitTimeoutError: Steps in flight did not finish within ``timeout``.
        """
        self._check_open()
        self._epoch += 1
        self._actors.discard()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.envs.decoupled.has_results():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.envs.recv(timeout=left)
        self.envs.async_reset(seed=seed, options=options)
        self._held.clear()
        self._at_env = set(range(self.envs.num_envs))
        self._broken = None
        self._started = True

    def run(
        self,
        steps_per_env: int,
        *,
        record: bool = True,
        on_transition: Callable[[Transition], None] | None = None,
        episodes_per_env: int | None = None,
        env_ids: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> DecoupledRollout:
        """Step every env ``steps_per_env`` times, each at its own pace, with the actors' actions.

        An env leaves the run once it has taken ``steps_per_env`` steps (or finished
        ``episodes_per_env`` episodes, counting terminations and truncations); the run
        returns when every env has left. Because each env takes the same number of steps,
        env ``i``'s trajectory depends only on env ``i`` and the policy: for a policy
        whose action for an observation does not depend on which other envs share its
        batch, it equals env ``i``'s part of a synchronous loop of ``steps_per_env``
        ``envs.step`` calls from the same reset. Autoreset follows the env's mode; the
        transitions are exactly what the env returned.

        Args:
            steps_per_env: Steps each env takes (>= 1).
            record: Keep every transition and return per-env trajectories (training);
                False keeps only counts and the final observations (evaluation).
            on_transition: Called in this thread with each [`Transition`][pipelined_vec_env.stepping.rollout_records.Transition] as it
                completes (per env in order; across envs in arrival order).
            episodes_per_env: Also stop an env after it finished this many episodes.
            env_ids: Only these envs take part (None: all); the others keep waiting with
                their latest observation (an env still resetting is received first).
            timeout: Most seconds to wait without any env result or actor reply; None
                waits while the workers are alive.

        Returns:
            A [`DecoupledRollout`][pipelined_vec_env.stepping.rollout_records.DecoupledRollout].

        Raises:
            RuntimeError: Closed, never reset, or broken by an earlier failure (call
                [`reset`][pipelined_vec_env.stepping.channel.InferenceChannel.reset]).
            ValueError: Bad ``steps_per_env`` / ``episodes_per_env``, or actions that do
                not fit the action space.
            WaitTimeoutError: Nothing happened within ``timeout`` seconds.
            WorkerCrashedError / the env's exception: A worker failed.
            Exception: An actor's policy raised: that exception, in this thread.
        """
        self._check_open()
        if not self._started:
            raise RuntimeError("run: call reset() first")
        if self._broken is not None:
            raise RuntimeError(
                f"run: an earlier run failed ({type(self._broken).__name__}: {self._broken}); "
                "call reset() before running again"
            ) from self._broken
        if not isinstance(steps_per_env, (int, np.integer)) or steps_per_env < 1:
            raise ValueError(f"steps_per_env: expected an int >= 1, got {steps_per_env!r}")
        if episodes_per_env is not None and (
            not isinstance(episodes_per_env, (int, np.integer)) or episodes_per_env < 1
        ):
            raise ValueError(
                f"episodes_per_env: expected None or an int >= 1, got {episodes_per_env!r}"
            )
        n = self.envs.num_envs
        if env_ids is None:
            participants = set(range(n))
        else:
            participants = {int(g) for g in env_ids}
            if not participants or not all(0 <= g < n for g in participants):
                raise ValueError(
                    f"env_ids: expected a non-empty set of ids in [0, {n}), got {env_ids!r}"
                )
        try:
            return self._run(
                int(steps_per_env), record, on_transition, episodes_per_env, participants, timeout
            )
        except BaseException as exc:
            self._broken = exc
            raise

    def _run(
        self,
        steps_per_env: int,
        record: bool,
        on_transition: Callable[[Transition], None] | None,
        episodes_per_env: int | None,
        participants: set[int],
        timeout: float | None,
    ) -> DecoupledRollout:
        began = time.monotonic()
        self._actors.reset_stats()
        run = RunState.start(
            self.envs.num_envs, steps_per_env, record, on_transition, episodes_per_env, participants
        )
        held = sorted(g for g in self._held if g in participants)
        if held:
            self._post(run, held, [self._held.pop(g) for g in held], time.monotonic())
        while run.posted or self._at_env:
            if self._results_due(run, timeout):
                self._take_results(run)
        return self._rollout(run, began)

    def _post(self, run: RunState, env_ids: list[int], obs_rows: list[Any], now: float) -> None:
        """Post the envs' observations to the actors: one request per worker (an env
        batch, as RLinf's env workers send them)."""
        obs_space = self.envs.single_observation_space
        groups: dict[int, list[int]] = {}
        for pos, g in enumerate(env_ids):
            groups.setdefault(int(self._worker_of[g]), []).append(pos)
        for positions in groups.values():
            ids = np.array([env_ids[p] for p in positions], dtype=np.int64)
            rows = [obs_rows[p] for p in positions]
            batch = rows[0] if len(rows) == 1 else concat_batches(obs_space, rows)
            if run.keep:
                for g, row in zip(ids.tolist(), rows, strict=True):
                    run.posted_obs[g] = row
            run.posted.update(ids.tolist())
            self._actors.post(Request(self._epoch, ids, batch, now))

    def _results_due(self, run: RunState, timeout: float | None) -> bool:
        """Send the actors' replies to their envs; without any, sleep until an env
        answers or an actor wakes the driver. True when envs may have results to read.

        Raises:
            WaitTimeoutError: Nothing happened within ``timeout`` seconds.
        """
        if not self._deliver(run):
            env_ready, woken = self._wait_for_events(self.envs, timeout)
            if not env_ready and not woken:
                raise WaitTimeoutError(
                    f"run: no env result or actor reply within {timeout} s "
                    f"({len(self._at_env)} envs stepping, {len(run.posted)} at the actors; "
                    f"{self._actors.diagnosis()})"
                )
            if not env_ready:
                return False
        return bool(self._at_env)

    def _take_results(self, run: RunState) -> None:
        """Read the envs' results that are in (without waiting): complete each env's
        transition, then hold the envs that are done and post the others' observations."""
        obs_space = self.envs.single_observation_space
        try:
            obs, rewards, terms, truncs, infos = self.envs.recv(timeout=0)
        except WaitTimeoutError:
            return
        now = time.monotonic()
        ids = infos["env_id"].tolist()
        rows = split_infos(infos, len(ids))
        go_ids: list[int] = []
        go_rows: list[Any] = []
        for k, g in enumerate(ids):
            self._at_env.discard(g)
            row = batch_slice(obs_space, obs, np.array([k]))
            if g in run.acted:
                info = rows[k]
                info.pop("env_id")  # recv's own key (the env's "env_id" is replaced)
                run.complete(g, float(rewards[k]), bool(terms[k]), bool(truncs[k]), info)
            if run.done(g):
                self._held[g] = row
            else:
                go_ids.append(g)
                go_rows.append(row)
        if go_ids:
            self._post(run, go_ids, go_rows, now)

    def _rollout(self, run: RunState, began: float) -> DecoupledRollout:
        """The run's result, every env held with its latest observation."""
        envs = self.envs
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        final = [self._held[g] for g in range(envs.num_envs)]
        trajectories = None
        if run.record:
            trajectories = [
                trajectory(g, column, obs_space, act_space) for g, column in enumerate(run.columns)
            ]
        return DecoupledRollout(
            steps=run.steps,
            final_obs=concat_batches(obs_space, final),
            trajectories=trajectories,
            actor_stats=self._actors.stats,
            turnaround=run.turnaround,
            wall_seconds=time.monotonic() - began,
        )

    def _deliver(self, run: RunState) -> bool:
        """Send every available actor reply to its envs; True if there was one."""
        got = False
        act_space = self.envs.single_action_space
        for reply in self._actors.replies():
            if reply.epoch != self._epoch:
                continue  # answers a request from before the last reset
            if reply.error is not None:
                error = reply.error
                if hasattr(error, "add_note"):
                    error.add_note(f"(raised by inference actor {reply.actor})")
                raise error
            got = True
            ids = reply.env_ids
            self.envs.send(reply.actions, ids)
            now = time.monotonic()
            run.turnaround.extend(now - t for t in reply.arrived_at)
            id_list = ids.tolist()
            run.posted.difference_update(id_list)
            self._at_env.update(id_list)
            for k, g in enumerate(id_list):
                if run.keep:
                    run.acted[g] = (
                        run.posted_obs.pop(g),
                        batch_slice(act_space, reply.actions, np.array([k])),
                        {key: v[k : k + 1] for key, v in reply.extras.items()},
                        reply.actor,
                    )
                else:
                    run.acted[g] = (None, None, {}, reply.actor)
        return got

    # ------------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the inference channel is closed")

    @property
    def actor_stats(self) -> list[ActorStats]:
        """Per-actor statistics of the current (or last) run."""
        return self._actors.stats

    def close(self, timeout: float = 5.0) -> None:
        """Stop the actors. Always returns within about ``timeout`` seconds.

        Queued requests are dropped; an actor still inside its policy is left to finish
        in its daemon thread (its reply is ignored). The env is not closed: it belongs to
        the caller (envs still stepping are collected or terminated by ``envs.close()``).

        Args:
            timeout: Seconds to wait for all actor threads together.
        """
        if self.closed:
            return
        self._actors.close(timeout)
        self.closed = True

    def __enter__(self) -> InferenceChannel:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"InferenceChannel(actors={self.num_actors}, env_workers={self.num_workers}, "
            f"rollout_queue_size={self.rollout_queue_size}, max_wait={self.max_wait})"
        )
