"""Rollout loops of the reference trainer: pipelined and serial give the same trajectories.

The test env is a tiny chunked env whose numbers are easy to predict: env ``i`` runs
episodes of ``4 + i`` primitive steps (even ids terminate with success, odd ids truncate),
reward 1 per primitive step, observation ``[env_id, steps_in_episode, drift]`` where the
drift integrates the actions, so a trajectory depends on every action taken.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from pipelined_vec_env.wrappers.action_chunk import ActionChunk
from reference_trainer.agent import ActorCritic, PolicyOutput
from reference_trainer.rollout import RolloutCollector
from tests.conftest import rollout_array_fields

CHUNK = 3
ACTION_DIM = 2

# Workers unpickle env constructors; by value, they need not import this module (and torch).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DriftEnv(gym.Env):
    """Episode of ``4 + env_id`` steps; obs ``[env_id, t, drift]``; reward 1 per step."""

    def __init__(self, env_id: int) -> None:
        self.env_id = env_id
        self.length = 4 + env_id
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.t = 0
        self.drift = np.float32(0.0)

    def _obs(self) -> np.ndarray:
        return np.array([self.env_id, self.t, self.drift], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.drift = np.float32(self.np_random.uniform(-1, 1))
        return self._obs(), {"is_success": False}

    def step(self, action: np.ndarray):
        self.t += 1
        action = np.asarray(action, dtype=np.float32)
        self.drift = np.float32(
            self.drift * np.float32(0.9) + action[0] - np.float32(0.5) * action[1]
        )
        done = self.t >= self.length
        terminated = done and self.env_id % 2 == 0
        truncated = done and self.env_id % 2 == 1
        return self._obs(), 1.0, terminated, truncated, {"is_success": terminated}


def make_drift_env(env_id: int) -> gym.Env:
    return ActionChunk(DriftEnv(env_id), CHUNK)


class ElementwisePolicy:
    """A policy built from elementwise ops only, so its rows do not depend on batch size.

    mean = tanh(w * drift + b), value = steps_in_episode (so ``V(final_obs)`` of a
    truncated episode is its length), log-prob of the standard Gaussian noise.
    """

    action_shape = (CHUNK, ACTION_DIM)

    def __init__(self) -> None:
        self.w = torch.linspace(-0.7, 0.9, CHUNK * ACTION_DIM)
        self.b = torch.linspace(0.2, -0.3, CHUNK * ACTION_DIM)

    def act(self, obs: torch.Tensor, noise: torch.Tensor | None) -> PolicyOutput:
        mean = torch.tanh(obs[:, 2:3] * self.w + self.b)
        action = mean if noise is None else mean + 0.5 * noise
        logprob = torch.zeros(obs.shape[0]) if noise is None else -0.5 * (noise * noise).sum(-1)
        return PolicyOutput(action.reshape(-1, *self.action_shape), logprob, self.get_value(obs))

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return obs[:, 1].clone()


def _collect(
    envs: Any,
    policy: Any,
    *,
    pipelined: bool,
    stage_order: str = "round_robin",
    rollouts: int = 2,
    num_steps: int = 7,
) -> list:
    collector = RolloutCollector(
        envs,
        policy,
        num_steps,
        torch.device("cpu"),
        pipelined=pipelined,
        stage_order=stage_order,
        noise_seed=11,
    )
    collector.reset(seed=3)
    return [collector.collect() for _ in range(rollouts)]


def _as_numpy(x: Any) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


FIELDS = rollout_array_fields()  # the per-step arrays of a Rollout


@pytest.mark.parametrize("num_stages", [1, 2, 3])
@pytest.mark.parametrize("stage_order", ["round_robin", "first_ready"])
def test_pipelined_and_serial_give_identical_trajectories(make_pipelined, num_stages, stage_order):
    fns = [functools.partial(make_drift_env, i) for i in range(5)]
    envs = make_pipelined(fns, num_stages=num_stages, autoreset_mode=AutoresetMode.SAME_STEP)
    pipelined = _collect(envs, ElementwisePolicy(), pipelined=True, stage_order=stage_order)
    serial = _collect(envs, ElementwisePolicy(), pipelined=False)
    for p, s in zip(pipelined, serial, strict=True):
        for name in FIELDS:
            a, b = _as_numpy(getattr(p, name)), _as_numpy(getattr(s, name))
            assert a.shape == b.shape and a.dtype == b.dtype, name
            np.testing.assert_array_equal(a, b, err_msg=name)
        assert p.episodes == s.episodes
        assert p.timings.env_steps == s.timings.env_steps
    # episodes did end and restart inside the rollouts, so autoreset paths were crossed
    assert sum(r.terminated.sum() + r.truncated.sum() for r in serial) >= 5


def test_actor_critic_rollouts_match_up_to_float_rounding(make_pipelined):
    fns = [functools.partial(make_drift_env, i) for i in range(4)]
    envs = make_pipelined(fns, num_stages=2, autoreset_mode=AutoresetMode.SAME_STEP)
    torch.manual_seed(0)
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, (16, 16))
    pipelined = _collect(envs, agent, pipelined=True)
    serial = _collect(envs, agent, pipelined=False)
    for p, s in zip(pipelined, serial, strict=True):
        for name in FIELDS:
            np.testing.assert_allclose(
                _as_numpy(getattr(p, name)).astype(np.float64),
                _as_numpy(getattr(s, name)).astype(np.float64),
                rtol=1e-5,
                atol=1e-5,
                err_msg=name,
            )
        np.testing.assert_array_equal(p.terminated, s.terminated)
        np.testing.assert_array_equal(p.truncated, s.truncated)


def _expected_chunk_steps(length: int, decisions: int) -> list[int]:
    """Primitive steps executed per decision for episodes of ``length`` steps, chunk 3."""
    per_episode = [CHUNK] * (math.ceil(length / CHUNK) - 1)
    per_episode.append(length - CHUNK * len(per_episode))
    return [per_episode[d % len(per_episode)] for d in range(decisions)]


def test_rollout_bookkeeping_matches_the_env(make_pipelined):
    num_envs, num_steps = 4, 9
    fns = [functools.partial(make_drift_env, i) for i in range(num_envs)]
    envs = make_pipelined(fns, num_stages=2, autoreset_mode=AutoresetMode.SAME_STEP)
    (rollout,) = _collect(
        envs, ElementwisePolicy(), pipelined=True, rollouts=1, num_steps=num_steps
    )

    expected_steps = 0
    for i in range(num_envs):
        length = 4 + i
        steps = _expected_chunk_steps(length, num_steps)
        expected_steps += sum(steps)
        np.testing.assert_array_equal(rollout.rewards[:, i], steps)  # 1 per primitive step
        ends = np.cumsum(steps) % length == 0
        np.testing.assert_array_equal(rollout.terminated[:, i], ends & (i % 2 == 0))
        np.testing.assert_array_equal(rollout.truncated[:, i], ends & (i % 2 == 1))
        # truncated episodes are bootstrapped with V(final_obs) = episode length
        expected_final = np.where(ends & (i % 2 == 1), float(length), 0.0)
        np.testing.assert_array_equal(rollout.final_values[:, i].numpy(), expected_final)
    assert rollout.timings.env_steps == expected_steps

    assert rollout.episodes, "episodes should have ended"
    for record in rollout.episodes:
        length = 4 + record.env_index
        assert record.length == length
        assert record.episode_return == float(length)
        assert record.terminated == (record.env_index % 2 == 0)
        assert record.success == (record.env_index % 2 == 0)
    keys = [(r.decision_index, r.env_index) for r in rollout.episodes]
    assert keys == sorted(keys)


def test_deterministic_collect_uses_the_policy_mean(make_pipelined):
    fns = [functools.partial(make_drift_env, i) for i in range(2)]
    envs = make_pipelined(fns, num_stages=2, autoreset_mode=AutoresetMode.SAME_STEP)
    policy = ElementwisePolicy()
    collector = RolloutCollector(envs, policy, 3, torch.device("cpu"), noise_seed=0)
    collector.reset(seed=0)
    rollout = collector.collect(deterministic=True)
    obs = rollout.obs.reshape(-1, 3)
    expected = torch.tanh(obs[:, 2:3] * policy.w + policy.b).reshape(3, 2, CHUNK, ACTION_DIM)
    torch.testing.assert_close(rollout.actions, expected, rtol=0, atol=0)


def test_rejects_envs_that_are_not_same_step():
    envs = SyncVectorEnv(
        [functools.partial(make_drift_env, 0)], autoreset_mode=AutoresetMode.NEXT_STEP
    )
    with pytest.raises(ValueError, match="SAME_STEP"):
        RolloutCollector(envs, ElementwisePolicy(), 4, torch.device("cpu"), pipelined=False)
    envs.close()


def test_pipelined_loop_needs_the_stage_api():
    envs = SyncVectorEnv(
        [functools.partial(make_drift_env, 0)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    with pytest.raises(ValueError, match="stage API"):
        RolloutCollector(envs, ElementwisePolicy(), 4, torch.device("cpu"), pipelined=True)
    # the serial loop works on any SAME_STEP VectorEnv
    collector = RolloutCollector(envs, ElementwisePolicy(), 4, torch.device("cpu"), pipelined=False)
    collector.reset(seed=0)
    assert collector.collect().rewards.shape == (4, 1)
    envs.close()


def test_collect_before_reset_raises():
    envs = SyncVectorEnv(
        [functools.partial(make_drift_env, 0)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    collector = RolloutCollector(envs, ElementwisePolicy(), 4, torch.device("cpu"), pipelined=False)
    with pytest.raises(RuntimeError, match="reset"):
        collector.collect()
    envs.close()


def _worker_nice(env: gym.Env) -> int:
    import os

    return os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.skipif(not hasattr(__import__("os"), "setpriority"), reason="needs os.setpriority")
def test_make_vector_env_sets_the_worker_priority():
    import os

    from reference_trainer.envs import GymEnvFactory, make_vector_env

    base = os.getpriority(os.PRIO_PROCESS, 0)
    envs = make_vector_env(
        GymEnvFactory("CartPole-v1"),
        4,
        num_stages=2,
        envs_per_worker=2,
        worker_nice=min(19, base + 3),
    )
    try:
        nice = envs.call_at(range(4), _worker_nice)
        assert nice == (min(19, base + 3),) * 4  # absolute, not stacked per env
        assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the trainer keeps its own
    finally:
        envs.close()


class ImageDriftEnv(DriftEnv):
    """DriftEnv with a Dict observation: the state and a 40x40 image that encodes it."""

    def __init__(self, env_id: int) -> None:
        super().__init__(env_id)
        self.observation_space = gym.spaces.Dict(
            {
                "state": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                "agentview_image": gym.spaces.Box(0, 255, (40, 40, 3), np.uint8),
            }
        )

    def _obs(self):
        state = super()._obs()
        image = np.full((40, 40, 3), int(self.t * 20 + self.env_id) % 256, dtype=np.uint8)
        return {"state": state, "agentview_image": image}


def test_image_observations_flow_through_both_loops(make_pipelined):
    fns = [functools.partial(ImageDriftEnv, i) for i in range(3)]
    envs = make_pipelined(fns, num_stages=3, autoreset_mode=AutoresetMode.SAME_STEP)
    torch.manual_seed(0)
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, (8,))
    pipelined = _collect(envs, agent, pipelined=True, rollouts=1, num_steps=6)[0]
    serial = _collect(envs, agent, pipelined=False, rollouts=1, num_steps=6)[0]
    assert pipelined.obs["agentview_image"].dtype == torch.uint8
    assert pipelined.obs["agentview_image"].shape == (6, 3, 40, 40, 3)
    torch.testing.assert_close(
        pipelined.obs["agentview_image"], serial.obs["agentview_image"], rtol=0, atol=0
    )
    torch.testing.assert_close(pipelined.obs["state"], serial.obs["state"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pipelined.values, serial.values, rtol=1e-5, atol=1e-5)
