"""Decoupled rollouts: several inference actors serve the env workers through a channel.

The runner behind ``--decoupled``. Every env is an independent stream: its worker posts
observations to an [`InferenceChannel`][pipelined_vec_env.stepping.channel.InferenceChannel], any idle actor
thread batches whatever has been posted and sends each action back to its env (RLinf's
env decoupled mode; Sample Factory's dynamic batching, Petrenko et al. 2020). Streams
advance at different rates, but each env takes exactly ``T`` decisions per rollout, so
the rollout still fills the trainer's ``(T, N, ...)`` buffers with one column per env:
column ``i`` is env ``i``'s own stream in order, and the per-column GAE of
`compute_gae` is per-env GAE over that stream, bootstrapped
from the env's own next observation. Exploration noise is drawn up front as
``(T, N, action_dim)`` and decision ``t`` of env ``i`` uses ``noise[t, i]``, exactly as in
`RolloutCollector`: for a policy whose rows do not
depend on the batch, decoupled, pipelined and serial rollouts are identical.

Actors share the trainer's policy module (inference only, under ``no_grad``, while the
trainer waits for the rollout), so they never see stale weights. Evaluation runs through
the same channel: one deterministic episode per env, in waves over the training envs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from pipelined_vec_env.stepping.channel import InferenceChannel, Transition
from reference_trainer.agent import RolloutPolicy, obs_to_tensor
from reference_trainer.envs import EnvFactory
from reference_trainer.evaluation import EvalResult
from reference_trainer.metrics import EpisodeRecord, RolloutTimings
from reference_trainer.rollout import Rollout, action_bounds, inference_span, stack_obs

__all__ = ["DecoupledRolloutCollector"]

_MAX_EVAL_DECISIONS = 1_000_000  # evaluation episodes end by termination or truncation


@dataclass
class _Episode:
    """The episode in progress in one env."""

    ret: float = 0.0
    length: int = 0
    success: bool = False
    reports: bool = False
    records: list[EpisodeRecord] = field(default_factory=list)


class DecoupledRolloutCollector:
    """Collects PPO rollouts with several inference actors over a shared channel.

    Same interface as `RolloutCollector` (``reset``,
    ``collect``, generator state), plus `evaluate` and `close`.

    Args:
        envs: a ``PipelinedVectorEnv`` in ``AutoresetMode.SAME_STEP`` (any ``num_stages``).
        policy: the policy (``ActorCritic`` or anything implementing ``RolloutPolicy``);
            every actor thread uses it.
        num_steps: decisions per env per rollout ``T``.
        device: the policy device.
        num_actors: inference actor threads (at most the number of env workers).
        rollout_queue_size: most env batches an actor merges into one forward pass;
            0: ``ceil(env workers / actors)``.
        max_wait: seconds an actor waits for more requests after the first.
        noise_seed: seed of the exploration-noise generator.
        steps_info_key: info key with the primitive steps a decision executed.
        steps_per_decision: primitive steps per decision when that key is absent.
        success_key: info key of the per-step sparse success flag.
        timeout: seconds a rollout may go without any env result or actor reply
            (None: no limit; dead workers are noticed regardless).

    Raises:
        ValueError: for an env not in SAME_STEP mode, a non-``Box`` action space, an env
            without ``async_reset``/``recv``/``send``, or more actors than env workers.
    """

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        policy: RolloutPolicy,
        num_steps: int,
        device: torch.device,
        *,
        num_actors: int = 1,
        rollout_queue_size: int = 0,
        max_wait: float = 0.0,
        noise_seed: int = 0,
        steps_info_key: str | None = "chunk_steps_executed",
        steps_per_decision: int = 1,
        success_key: str = "is_success",
        timeout: float | None = None,
    ) -> None:
        if envs.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
            raise ValueError(
                "DecoupledRolloutCollector needs AutoresetMode.SAME_STEP envs, got "
                f"{envs.metadata.get('autoreset_mode')!r}"
            )
        action_space = envs.single_action_space
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"a Box action space is required, got {action_space}")
        if not all(hasattr(envs, name) for name in ("async_reset", "recv", "send", "stages")):
            raise ValueError(
                f"{type(envs).__name__} has no decoupled API (async_reset/recv/send); "
                "use PipelinedVectorEnv"
            )
        self.envs = envs
        self.policy = policy
        self.num_steps = int(num_steps)
        self.device = device
        self.num_envs = envs.num_envs
        self.action_shape, self.action_dim, self._low, self._high = action_bounds(action_space)
        self.steps_info_key = steps_info_key
        self.steps_per_decision = int(steps_per_decision)
        self.success_key = success_key
        self.timeout = timeout
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(noise_seed))
        self.channel = InferenceChannel(
            envs,  # type: ignore[arg-type]
            [self._act] * int(num_actors),
            rollout_queue_size=rollout_queue_size,
            max_wait=max_wait,
            name="rollout",
        )
        self._noise: torch.Tensor | None = None
        self._decision = np.zeros(self.num_envs, dtype=np.int64)
        self._episodes = [_Episode() for _ in range(self.num_envs)]
        self._ready = False
        self._span = inference_span(envs)

    # -- state -------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> None:
        """Reset every env (env ``i`` gets ``seed + i``) and forget episodes in progress."""
        self.channel.reset(seed=seed, timeout=self.timeout)
        self._episodes = [_Episode() for _ in range(self.num_envs)]
        self._ready = True

    def generator_state(self) -> torch.Tensor:
        """State of the exploration-noise generator (for checkpoints)."""
        return self.generator.get_state()

    def set_generator_state(self, state: torch.Tensor) -> None:
        """Restore the exploration-noise generator from `generator_state`."""
        self.generator.set_state(state)

    def close(self) -> None:
        """Stop the actor threads (the env is the caller's to close)."""
        self.channel.close()

    # -- inference (actor threads) -----------------------------------------------------

    @torch.no_grad()
    def _act(self, obs: Any, env_ids: np.ndarray) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        # one request per env at a time, so envs served by different actors never collide
        decisions = self._decision[env_ids].copy()
        self._decision[env_ids] += 1
        noise = None
        if self._noise is not None:
            rows = torch.as_tensor(decisions, device=self.device)
            cols = torch.as_tensor(env_ids, device=self.device)
            noise = self._noise[rows, cols]
        with self._span(None):  # the copy to the CPU waits for the device too
            out = self.policy.act(obs_to_tensor(obs, self.device), noise)
            action = out.action.detach().float()
            clipped = np.clip(action.cpu().numpy(), self._low, self._high)
        return clipped, {"action": action, "logprob": out.logprob, "value": out.value}

    # -- one rollout -------------------------------------------------------------------

    @torch.no_grad()
    def collect(self, deterministic: bool = False) -> Rollout:
        """Run ``T`` decisions in every env, each env at its own pace, and return the rollout.

        Args:
            deterministic: act with the policy mean (no exploration noise).

        Returns:
            The ``Rollout`` in the layout of ``RolloutCollector.collect``. Its timings:
            ``inference_s`` sums the actors' forward passes (they may overlap, so it can
            exceed the wall time with several actors); ``env_wait_s`` is not measured
            (the driver waits on envs and actors at once).

        Raises:
            RuntimeError: if `reset` was not called (first, or after `evaluate`).
            Exception: an actor's or env's error, raised in this thread.
        """
        if not self._ready:
            raise RuntimeError("call reset() before collect()")
        start = time.perf_counter()
        T, N, dev = self.num_steps, self.num_envs, self.device
        self._decision[:] = 0
        self._noise = (
            None
            if deterministic
            else torch.randn((T, N, self.action_dim), generator=self.generator, device=dev)
        )
        result = self.channel.run(T, timeout=self.timeout)
        space = self.envs.single_observation_space
        batch = result.stack(space, self.envs.single_action_space)
        extras = batch["extras"]

        timings = RolloutTimings()
        timings.inference_s = sum(sum(s.infer_seconds) for s in result.actor_stats)
        t0 = time.perf_counter()
        final_values = torch.zeros((T, N), dtype=torch.float32, device=dev)
        boot_at, boot_obs = [], []
        episodes: list[EpisodeRecord] = []
        for g, traj in enumerate(result.trajectories or []):
            for t in range(T):
                terminated, truncated = bool(traj.terminations[t]), bool(traj.truncations[t])
                info = traj.infos[t]
                if truncated and not terminated:
                    if "final_obs" not in info:
                        raise RuntimeError(
                            "a truncated episode came without info['final_obs']; is the env "
                            "in SAME_STEP mode?"
                        )
                    boot_at.append((t, g))
                    boot_obs.append(info["final_obs"])
                timings.env_steps += self._track(
                    g, t, float(traj.rewards[t]), terminated, truncated, info, episodes
                )
        if boot_obs:
            values = self.policy.get_value(obs_to_tensor(stack_obs(boot_obs), dev)).float()
            index = torch.as_tensor(boot_at, device=dev)
            final_values[index[:, 0], index[:, 1]] = values
        next_value = self.policy.get_value(obs_to_tensor(result.final_obs, dev)).float()
        timings.inference_s += time.perf_counter() - t0
        timings.decisions = T * N
        timings.rollout_s = time.perf_counter() - start
        return Rollout(
            obs=obs_to_tensor(batch["obs"], dev),
            actions=torch.as_tensor(extras["action"], device=dev).reshape(T, N, *self.action_shape),
            logprobs=torch.as_tensor(extras["logprob"], device=dev).float(),
            values=torch.as_tensor(extras["value"], device=dev).float(),
            rewards=batch["rewards"],
            terminated=batch["terminations"],
            truncated=batch["truncations"],
            final_values=final_values,
            next_value=next_value,
            episodes=sorted(episodes, key=lambda r: (r.decision_index, r.env_index)),
            timings=timings,
        )

    def _track(
        self,
        env: int,
        decision: int,
        reward: float,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
        finished: list[EpisodeRecord],
    ) -> int:
        """Fold one decision into env ``env``'s episode; return its primitive steps."""
        ended = terminated or truncated
        # SAME_STEP: at an episode's end `info` is the next episode's reset info and the
        # last step's own info is in info["final_info"]
        step_info = info.get("final_info", {}) if ended else info
        key = self.steps_info_key
        steps = self.steps_per_decision
        if key is not None:
            steps = int(step_info.get(key, info.get(key, steps)))
        episode = self._episodes[env]
        episode.ret += reward
        episode.length += steps
        episode.success |= bool(step_info.get(self.success_key, False))
        episode.reports |= self.success_key in info or self.success_key in step_info
        if ended:
            finished.append(
                EpisodeRecord(
                    env_index=env,
                    decision_index=decision,
                    episode_return=episode.ret,
                    length=episode.length,
                    success=episode.success if episode.reports else None,
                    terminated=terminated,
                )
            )
            episode.ret, episode.length, episode.success = 0.0, 0, False
        return steps

    # -- evaluation --------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(
        self,
        factory: EnvFactory,
        episodes: int,
        eval_seed: int,
        *,
        then_reset_seed: int | None = None,
    ) -> EvalResult:
        """Run ``episodes`` deterministic episodes through the channel, on the training envs.

        Episode ``j`` is reset with ``seed = eval_seed + j`` and
        ``factory.eval_reset_options(j)``, as in `reference_trainer.evaluation.evaluate`;
        episodes run in waves of ``num_envs``, each env playing one episode per wave.

        Args:
            factory: gives the per-episode reset options and the steps-per-decision info.
            episodes: number of episodes.
            eval_seed: seed of episode 0.
            then_reset_seed: reset the envs for training afterwards with this seed; None
                leaves them to a later `reset` (``collect`` refuses until then).

        Returns:
            Per-episode returns, primitive lengths and successes, in episode order.
        """
        self._ready = False
        self._noise = None
        n = self.num_envs
        result = EvalResult()
        successes: list[bool | None] = []
        for first in range(0, episodes, n):
            count = min(n, episodes - first)
            seeds = [eval_seed + first + k if k < count else None for k in range(n)]
            options = [
                factory.eval_reset_options(first + k) if k < count else None for k in range(n)
            ]
            self.channel.reset(seed=seeds, options=options, timeout=self.timeout)
            self._episodes = [_Episode() for _ in range(n)]
            ended: dict[int, EpisodeRecord] = {}

            def on_transition(tr: Transition, ended: dict[int, EpisodeRecord] = ended) -> None:
                records: list[EpisodeRecord] = []
                self._track(
                    tr.env_id, tr.step, tr.reward, tr.terminated, tr.truncated, tr.info, records
                )
                if records:
                    ended[tr.env_id] = records[0]

            self._decision[:] = 0
            self.channel.run(
                _MAX_EVAL_DECISIONS,
                record=False,
                on_transition=on_transition,
                episodes_per_env=1,
                env_ids=range(count),
                timeout=self.timeout,
            )
            for k in range(count):
                record = ended[k]
                result.returns.append(record.episode_return)
                result.lengths.append(record.length)
                successes.append(record.success)
        if successes and all(s is not None for s in successes):
            result.successes = [bool(s) for s in successes]
        if then_reset_seed is not None:
            self.reset(then_reset_seed)
        return result
