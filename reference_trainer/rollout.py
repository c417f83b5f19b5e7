"""Rollout loops: the pipelined one that overlaps inference with env stepping, and serial.

Pipelined (one call in flight per stage):

    for each stage s:  infer(s, t=0); step_async(actions_s, stage=s)
    until every stage has taken T decisions:
        s = next stage (round robin, or whichever finished first via ``wait_any``)
        step_wait(stage=s)           # the other stages keep stepping meanwhile
        record step t of stage s
        infer(s, t+1); step_async(actions_s, stage=s)   # overlaps the others' stepping

Serial: ``infer(all envs); step(all envs)`` T times.

Both loops write the same buffer layout, ``(T, N, ...)`` with ``N`` in global env order.
The exploration noise for the whole rollout is drawn up front as ``(T, N, action_dim)``,
so env ``i``'s decision ``t`` gets the same noise whichever batch it was inferred in: with
a batch-invariant policy and the same seeds, the two loops give identical trajectories.

Envs must use ``AutoresetMode.SAME_STEP``: an episode's last observation arrives in
``info["final_obs"]``, so a truncated episode is bootstrapped with ``V(final_obs)`` and no
decision is wasted on a reset step.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from reference_trainer.agent import ObsBatch, RolloutPolicy, map_obs, obs_to_tensor
from reference_trainer.metrics import EpisodeRecord, RolloutTimings

__all__ = ["Rollout", "RolloutCollector", "StageOrder", "inference_span"]

StageOrder = Literal["round_robin", "first_ready"]

NumpyObs = np.ndarray | dict[str, np.ndarray]


@dataclass
class Rollout:
    """One rollout of ``T`` decisions in ``N`` envs, global env order on axis 1.

    Attributes:
        obs: ``(T, N, ...)`` observations the decisions were taken on (policy device).
        actions: ``(T, N, *action_shape)`` float32 unclipped actions (policy device).
        logprobs: ``(T, N)`` float32 (policy device).
        values: ``(T, N)`` float32 (policy device).
        rewards: ``(T, N)`` float64 raw rewards (summed over an action chunk), numpy.
        terminated: ``(T, N)`` bool, numpy.
        truncated: ``(T, N)`` bool, numpy.
        final_values: ``(T, N)`` float32 ``V(final_obs)`` where truncated (and not
            terminated), else 0 (policy device).
        next_value: ``(N,)`` float32 value of the observation after the last decision.
        episodes: episodes that ended during the rollout, sorted by (decision, env).
        timings: where the rollout's time went.
    """

    obs: ObsBatch
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_values: torch.Tensor
    next_value: torch.Tensor
    episodes: list[EpisodeRecord] = field(default_factory=list)
    timings: RolloutTimings = field(default_factory=RolloutTimings)


def _obs_slice(obs: NumpyObs, index: slice | np.ndarray) -> NumpyObs:
    return map_obs(obs, lambda value: value[index])


def _obs_assign(target: NumpyObs, index: slice, value: NumpyObs) -> None:
    if isinstance(target, dict):
        assert isinstance(value, Mapping)
        for key in target:
            target[key][index] = value[key]
    else:
        target[index] = value


def _obs_copy(obs: NumpyObs) -> NumpyObs:
    return map_obs(obs, lambda value: np.array(value, copy=True))


def action_bounds(action_space: Any) -> tuple[tuple[int, ...], int, np.ndarray, np.ndarray]:
    """``(shape, flat size, low, high)`` of a Box action space; ``low``/``high`` are float32
    arrays of that shape (the clipping bounds of the sampled actions)."""
    shape = tuple(action_space.shape)
    low = np.broadcast_to(action_space.low, shape).astype(np.float32)
    high = np.broadcast_to(action_space.high, shape).astype(np.float32)
    return shape, int(np.prod(shape)), low, high


def stack_obs(items: list[Any]) -> NumpyObs:
    """Stack per-env observations (``info["final_obs"]`` entries, arrays or dicts of
    arrays of equal shapes) into one batch with a leading env axis."""
    if isinstance(items[0], Mapping):
        return {key: np.stack([item[key] for item in items]) for key in items[0]}
    return np.stack(items)


def _info_flags(info: Mapping[str, Any], key: str, n: int) -> np.ndarray:
    """Boolean ``(n,)`` of ``info[key]`` where present (gymnasium's ``_key`` mask)."""
    if key not in info:
        return np.zeros(n, dtype=bool)
    values = np.asarray(info[key]).astype(bool).reshape(n)
    mask = np.asarray(info.get(f"_{key}", np.ones(n, dtype=bool))).astype(bool).reshape(n)
    return values & mask


def _info_counts(info: Mapping[str, Any], key: str, n: int, default: int) -> np.ndarray:
    """Integer ``(n,)`` of ``info[key]`` where present, else ``default``."""
    counts = np.full(n, default, dtype=np.int64)
    if key in info:
        mask = np.asarray(info.get(f"_{key}", np.ones(n, dtype=bool))).astype(bool).reshape(n)
        values = np.asarray(info[key]).reshape(n)
        counts[mask] = values[mask].astype(np.int64)
    return counts


class _EpisodeTracker:
    """Running return, length and success of the episode in progress in each env."""

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.success = np.zeros(num_envs, dtype=bool)
        self.reports_success = np.zeros(num_envs, dtype=bool)

    def reset(self) -> None:
        self.returns[:] = 0.0
        self.lengths[:] = 0
        self.success[:] = False

    def step(
        self,
        index: slice,
        decision: int,
        rewards: np.ndarray,
        lengths: np.ndarray,
        success: np.ndarray,
        reports_success: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> list[EpisodeRecord]:
        self.returns[index] += rewards
        self.lengths[index] += lengths
        self.success[index] |= success
        self.reports_success[index] |= reports_success
        finished = []
        offset = index.start or 0
        for local in np.flatnonzero(terminated | truncated):
            env = offset + int(local)
            finished.append(
                EpisodeRecord(
                    env_index=env,
                    decision_index=decision,
                    episode_return=float(self.returns[env]),
                    length=int(self.lengths[env]),
                    success=bool(self.success[env]) if self.reports_success[env] else None,
                    terminated=bool(terminated[local]),
                )
            )
            self.returns[env] = 0.0
            self.lengths[env] = 0
            self.success[env] = False
        return finished


class RolloutCollector:
    """Collects PPO rollouts from a (staged) vector env with a pipelined or serial loop.

    Args:
        envs: a gymnasium ``VectorEnv`` in ``AutoresetMode.SAME_STEP``. For the pipelined
            loop it must offer the stage API of ``PipelinedVectorEnv``: ``stage_slices``,
            ``step_async(actions, stage=s)``, ``step_wait(stage=s)`` and, for
            ``stage_order="first_ready"``, ``wait_any()``.
        policy: the policy (``ActorCritic`` or anything implementing ``RolloutPolicy``).
        num_steps: decisions per env per rollout ``T``.
        device: the policy device.
        pipelined: overlap inference of one stage with stepping of the others; False runs
            the serial loop (infer all, step all).
        stage_order: which stage to wait for next: ``"round_robin"`` (fixed order) or
            ``"first_ready"`` (whichever stage finished first, via ``envs.wait_any()``).
        noise_seed: seed of the exploration-noise generator.
        steps_info_key: info key with the primitive steps a decision executed (action
            chunks that end early); absent means ``steps_per_decision``.
        steps_per_decision: primitive env steps per decision when ``steps_info_key`` is
            absent (the chunk length ``K``; 1 for plain envs).
        success_key: info key of the per-step sparse success flag.

    Raises:
        ValueError: for an env not in SAME_STEP autoreset mode, a non-``Box`` action space,
            or a pipelined loop over an env without the stage API.
    """

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        policy: RolloutPolicy,
        num_steps: int,
        device: torch.device,
        *,
        pipelined: bool = True,
        stage_order: StageOrder = "round_robin",
        noise_seed: int = 0,
        steps_info_key: str | None = "chunk_steps_executed",
        steps_per_decision: int = 1,
        success_key: str = "is_success",
    ) -> None:
        mode = envs.metadata.get("autoreset_mode")
        if mode != AutoresetMode.SAME_STEP:
            raise ValueError(
                f"RolloutCollector needs AutoresetMode.SAME_STEP envs, got {mode!r}; "
                "build the vector env with autoreset_mode=AutoresetMode.SAME_STEP"
            )
        action_space = envs.single_action_space
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"a Box action space is required, got {action_space}")
        if pipelined and not hasattr(envs, "stage_slices"):
            raise ValueError(
                f"{type(envs).__name__} has no stage API; use PipelinedVectorEnv or pipelined=False"
            )
        if stage_order not in ("round_robin", "first_ready"):
            raise ValueError(f"unknown stage_order {stage_order!r}")
        self.envs = envs
        self.policy = policy
        self.num_steps = int(num_steps)
        self.device = device
        self.pipelined = pipelined
        self.stage_order = stage_order
        self.num_envs = envs.num_envs
        self.stage_slices: tuple[slice, ...] = tuple(
            getattr(envs, "stage_slices", (slice(0, self.num_envs),))
        )
        self.action_shape, self.action_dim, self._low, self._high = action_bounds(action_space)
        self.steps_info_key = steps_info_key
        self.steps_per_decision = int(steps_per_decision)
        self.success_key = success_key
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(noise_seed))
        self.next_obs: NumpyObs | None = None
        self._tracker = _EpisodeTracker(self.num_envs)
        self._span = inference_span(envs)

    # -- state -------------------------------------------------------------------------

    def reset(self, seed: int | None = None, options: Any = None) -> None:
        """Reset every env (env ``i`` gets ``seed + i``) and forget episodes in progress.

        Args:
            seed: base seed, or None.
            options: reset options: one dict for every env, a list of one dict (or None)
                per env, or None.
        """
        obs, _ = self.envs.reset(seed=seed, options=options)
        self.next_obs = _obs_copy(obs)
        self._tracker.reset()

    def generator_state(self) -> torch.Tensor:
        """State of the exploration-noise generator (for checkpoints)."""
        return self.generator.get_state()

    def set_generator_state(self, state: torch.Tensor) -> None:
        """Restore the exploration-noise generator from `generator_state`."""
        self.generator.set_state(state)

    # -- one rollout -------------------------------------------------------------------

    @torch.no_grad()
    def collect(self, deterministic: bool = False) -> Rollout:
        """Run ``T`` decisions in every env and return the rollout.

        Args:
            deterministic: act with the policy mean (no exploration noise).

        Returns:
            The ``Rollout``; the collector keeps the last observations for the next call.

        Raises:
            RuntimeError: if `reset` was never called.
        """
        if self.next_obs is None:
            raise RuntimeError("call reset() before collect()")
        start = time.perf_counter()
        self._timings = RolloutTimings()
        self._episodes: list[EpisodeRecord] = []
        T, N = self.num_steps, self.num_envs
        if deterministic:
            self._noise = None
        else:
            self._noise = torch.randn(
                (T, N, self.action_dim), generator=self.generator, device=self.device
            )
        self._alloc(T, N)
        if self.pipelined:
            self._collect_pipelined()
        else:
            self._collect_serial()
        t0 = time.perf_counter()
        with self._span(None):
            next_value = self.policy.get_value(obs_to_tensor(self.next_obs, self.device))
        self._timings.inference_s += time.perf_counter() - t0
        self._timings.rollout_s = time.perf_counter() - start
        self._timings.decisions = T * N
        episodes = sorted(self._episodes, key=lambda r: (r.decision_index, r.env_index))
        return Rollout(
            obs=self._obs,
            actions=self._actions,
            logprobs=self._logprobs,
            values=self._values,
            rewards=self._rewards,
            terminated=self._terminated,
            truncated=self._truncated,
            final_values=self._final_values,
            next_value=next_value.float(),
            episodes=episodes,
            timings=self._timings,
        )

    def _alloc(self, T: int, N: int) -> None:
        dev = self.device
        assert self.next_obs is not None
        if isinstance(self.next_obs, dict):
            self._obs: ObsBatch = {
                key: torch.zeros((T, *value.shape), dtype=_torch_dtype(value), device=dev)
                for key, value in self.next_obs.items()
            }
        else:
            self._obs = torch.zeros(
                (T, *self.next_obs.shape), dtype=_torch_dtype(self.next_obs), device=dev
            )
        self._actions = torch.zeros((T, N, *self.action_shape), dtype=torch.float32, device=dev)
        self._logprobs = torch.zeros((T, N), dtype=torch.float32, device=dev)
        self._values = torch.zeros((T, N), dtype=torch.float32, device=dev)
        self._final_values = torch.zeros((T, N), dtype=torch.float32, device=dev)
        self._rewards = np.zeros((T, N), dtype=np.float64)
        self._terminated = np.zeros((T, N), dtype=bool)
        self._truncated = np.zeros((T, N), dtype=bool)

    def _collect_serial(self) -> None:
        everything = slice(0, self.num_envs)
        for t in range(self.num_steps):
            actions = self._infer(everything, t, None)
            t0 = time.perf_counter()
            result = self.envs.step(actions)
            self._timings.env_wait_s += time.perf_counter() - t0
            self._record(everything, t, result)

    def _collect_pipelined(self) -> None:
        envs: Any = self.envs
        num_stages = len(self.stage_slices)
        decision = [0] * num_stages
        for stage, index in enumerate(self.stage_slices):
            self._send(stage, self._infer(index, 0, stage))
        pending = set(range(num_stages))
        round_robin = itertools.cycle(range(num_stages))
        while pending:
            t0 = time.perf_counter()
            if self.stage_order == "first_ready":
                stage = int(envs.wait_any())
            else:
                stage = next(s for s in round_robin if s in pending)
            result = envs.step_wait(stage=stage)
            self._timings.env_wait_s += time.perf_counter() - t0
            index = self.stage_slices[stage]
            self._record(index, decision[stage], result)
            decision[stage] += 1
            if decision[stage] < self.num_steps:
                self._send(stage, self._infer(index, decision[stage], stage))
            else:
                pending.discard(stage)

    def _send(self, stage: int, actions: np.ndarray) -> None:
        t0 = time.perf_counter()
        self.envs.step_async(actions, stage=stage)  # type: ignore[call-arg]
        self._timings.env_send_s += time.perf_counter() - t0

    def _infer(self, index: slice, t: int, stage: int | None) -> np.ndarray:
        """Infer stage ``index``'s decision ``t``; return clipped numpy actions for the envs."""
        with self._span(stage):
            return self._infer_unprofiled(index, t)

    def _infer_unprofiled(self, index: slice, t: int) -> np.ndarray:
        assert self.next_obs is not None
        t0 = time.perf_counter()
        obs = obs_to_tensor(_obs_slice(self.next_obs, index), self.device)
        if isinstance(obs, dict):
            assert isinstance(self._obs, dict)
            for key, value in obs.items():
                self._obs[key][t, index] = value
        else:
            assert isinstance(self._obs, torch.Tensor)
            self._obs[t, index] = obs
        noise = None if self._noise is None else self._noise[t, index]
        out = self.policy.act(obs, noise)
        self._actions[t, index] = out.action
        self._logprobs[t, index] = out.logprob
        self._values[t, index] = out.value
        actions = out.action.detach().to("cpu", torch.float32).numpy()
        self._timings.inference_s += time.perf_counter() - t0
        return np.clip(actions, self._low, self._high)

    def _record(self, index: slice, t: int, result: tuple) -> None:
        """Store the step result of envs ``index`` for decision ``t``."""
        obs, rewards, terminated, truncated, info = result
        assert self.next_obs is not None
        n = len(range(*index.indices(self.num_envs)))
        rewards = np.asarray(rewards, dtype=np.float64).reshape(n)
        terminated = np.asarray(terminated, dtype=bool).reshape(n)
        truncated = np.asarray(truncated, dtype=bool).reshape(n)
        self._rewards[t, index] = rewards
        self._terminated[t, index] = terminated
        self._truncated[t, index] = truncated
        _obs_assign(self.next_obs, index, obs)

        final_info = info.get("final_info", {}) if isinstance(info, Mapping) else {}
        ended = terminated | truncated
        success = _info_flags(info, self.success_key, n) & ~ended
        reports = np.full(n, self.success_key in info or self.success_key in final_info)
        success |= _info_flags(final_info, self.success_key, n) & ended
        lengths = _info_counts(info, self.steps_info_key, n, self.steps_per_decision)
        if self.steps_info_key is not None and self.steps_info_key in final_info:
            lengths[ended] = _info_counts(
                final_info, self.steps_info_key, n, self.steps_per_decision
            )[ended]
        self._timings.env_steps += int(lengths.sum())

        bootstrap = truncated & ~terminated
        if bootstrap.any():
            self._bootstrap_final_values(index, t, info, bootstrap)
        self._episodes += self._tracker.step(
            slice(index.start or 0, (index.start or 0) + n),
            t,
            rewards,
            lengths,
            success,
            reports,
            terminated,
            truncated,
        )

    def _bootstrap_final_values(
        self, index: slice, t: int, info: Mapping[str, Any], bootstrap: np.ndarray
    ) -> None:
        if "final_obs" not in info:
            raise RuntimeError(
                "a truncated episode came without info['final_obs']; is the env in SAME_STEP mode?"
            )
        local = np.flatnonzero(bootstrap)
        t0 = time.perf_counter()
        final_obs = stack_obs([info["final_obs"][i] for i in local])
        values = self.policy.get_value(obs_to_tensor(final_obs, self.device)).float()
        start = index.start or 0
        self._final_values[t, torch.as_tensor(start + local, device=self.device)] = values
        self._timings.inference_s += time.perf_counter() - t0


def inference_span(envs: Any) -> Any:
    """A function ``stage -> context manager`` timing inference as a profiler span named
    ``"inference"`` when ``envs`` (or what it wraps) records a profile, else doing nothing."""
    profiler = getattr(getattr(envs, "unwrapped", envs), "profiler", None)
    if profiler is None or not profiler.enabled:
        return lambda stage: contextlib.nullcontext()
    return lambda stage: profiler.span("inference", stage)


def _torch_dtype(array: np.ndarray) -> torch.dtype:
    return torch.uint8 if np.asarray(array).dtype == np.uint8 else torch.float32
