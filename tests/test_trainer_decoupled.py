"""The decoupled runner: per-env streams at different rates give the serial loop's rollout.

Envs step at different, fixed speeds, so under the channel their streams advance at
different rates; with a policy whose rows do not depend on the batch and the same noise
seed, every rollout field (observations, actions, log-probs, values, rewards, episode
ends, truncation bootstraps, next values, episodes) must equal the serial loop's, and so
must the per-env GAE computed from them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from pipelined_vec_env.wrappers.action_chunk import ActionChunk
from reference_trainer.config import TrainConfig
from reference_trainer.decoupled_rollout import DecoupledRolloutCollector
from reference_trainer.evaluation import evaluate
from reference_trainer.ppo import compute_gae
from reference_trainer.rollout import RolloutCollector
from reference_trainer.train import train
from tests.conftest import needs_libero, rollout_array_fields, tiny_libero_args
from tests.test_trainer_rollout import CHUNK, DriftEnv, ElementwisePolicy

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[1]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FIELDS = rollout_array_fields()  # the per-step arrays of a Rollout


class Slow(gym.Wrapper):
    """Sleeps a fixed time per primitive step: env streams advance at different rates."""

    def __init__(self, env: gym.Env, seconds: float) -> None:
        super().__init__(env)
        self.seconds = seconds

    def step(self, action: Any):
        time.sleep(self.seconds)
        return self.env.step(action)


def make_slow_drift_env(env_id: int) -> gym.Env:
    return ActionChunk(Slow(DriftEnv(env_id), 0.0005 * (env_id % 3)), CHUNK)


def _as_numpy(x: Any) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _serial(envs: Any, rollouts: int, num_steps: int) -> list:
    collector = RolloutCollector(
        envs, ElementwisePolicy(), num_steps, torch.device("cpu"), pipelined=False, noise_seed=11
    )
    collector.reset(seed=3)
    return [collector.collect() for _ in range(rollouts)]


@pytest.mark.parametrize("num_stages,envs_per_worker,num_actors", [(1, 1, 3), (2, 2, 2)])
def test_decoupled_rollouts_equal_the_serial_loop(
    make_pipelined, num_stages, envs_per_worker, num_actors
):
    fns = [functools.partial(make_slow_drift_env, i) for i in range(5)]
    envs = make_pipelined(
        fns,
        num_stages=num_stages,
        envs_per_worker=envs_per_worker,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    num_steps, rollouts = 7, 2
    expected = _serial(envs, rollouts, num_steps)
    collector = DecoupledRolloutCollector(
        envs,
        ElementwisePolicy(),
        num_steps,
        torch.device("cpu"),
        num_actors=num_actors,
        max_wait=0.001,
        noise_seed=11,
        timeout=60,
    )
    try:
        collector.reset(seed=3)
        got = [collector.collect() for _ in range(rollouts)]
    finally:
        collector.close()
    for g, e in zip(got, expected, strict=True):
        for name in FIELDS:
            a, b = _as_numpy(getattr(g, name)), _as_numpy(getattr(e, name))
            assert a.shape == b.shape and a.dtype == b.dtype, name
            np.testing.assert_array_equal(a, b, err_msg=name)
        assert g.episodes == e.episodes and g.episodes  # episodes ended, in the same order
        assert g.timings.env_steps == e.timings.env_steps
        assert g.timings.decisions == e.timings.decisions == num_steps * 5
        ends = torch.from_numpy(g.terminated | g.truncated)
        rewards = torch.from_numpy(g.rewards.astype(np.float32)) + 0.9 * g.final_values
        adv_g, _ = compute_gae(rewards, g.values, ends, g.next_value, 0.9, 0.95)
        rewards = torch.from_numpy(e.rewards.astype(np.float32)) + 0.9 * e.final_values
        adv_e, _ = compute_gae(
            rewards, e.values, torch.from_numpy(e.terminated | e.truncated), e.next_value, 0.9, 0.95
        )
        torch.testing.assert_close(adv_g, adv_e, rtol=0, atol=0)
    assert (got[0].truncated & ~got[0].terminated).any()  # bootstraps were exercised


def test_collector_validation(make_pipelined):
    next_step = make_pipelined([functools.partial(make_slow_drift_env, 0)])
    with pytest.raises(ValueError, match="SAME_STEP"):
        DecoupledRolloutCollector(next_step, ElementwisePolicy(), 4, torch.device("cpu"))
    envs = make_pipelined(
        [functools.partial(make_slow_drift_env, i) for i in range(2)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    with pytest.raises(ValueError, match="3 actors but only 2 env workers"):
        DecoupledRolloutCollector(envs, ElementwisePolicy(), 4, torch.device("cpu"), num_actors=3)
    collector = DecoupledRolloutCollector(envs, ElementwisePolicy(), 4, torch.device("cpu"))
    try:
        with pytest.raises(RuntimeError, match="reset"):
            collector.collect()
    finally:
        collector.close()


class SeedEnv(gym.Env):
    """Episode length from the reset options; reward = drift, which depends on the seed."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.t, self.length, self.drift = 0, 3, np.float32(0.0)

    def _obs(self) -> np.ndarray:
        return np.array([0.0, self.t, self.drift], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t, self.length = 0, int((options or {}).get("length", 3))
        self.drift = np.float32(self.np_random.uniform(-1, 1))
        return self._obs(), {"is_success": False}

    def step(self, action: np.ndarray):
        self.t += 1
        self.drift = np.float32(0.9 * self.drift + float(action[0]))
        done = self.t >= self.length
        terminated, truncated = done and self.length % 2 == 0, done and self.length % 2 == 1
        return self._obs(), float(self.drift), terminated, truncated, {"is_success": terminated}


def make_seed_env() -> gym.Env:
    return ActionChunk(SeedEnv(), CHUNK)


@dataclasses.dataclass
class SeedFactory:
    steps_per_decision: int = CHUNK
    steps_info_key: str | None = "chunk_steps_executed"

    def env_fn(self, index: int, *, render: bool = False):
        return make_seed_env

    def eval_reset_options(self, episode: int) -> dict[str, Any] | None:
        return {"length": 2 + 2 * episode}  # episode j: 2 + 2j primitive steps


def test_decoupled_evaluation_equals_the_in_process_one(make_pipelined):
    factory = SeedFactory()
    policy = ElementwisePolicy()
    envs = make_pipelined(
        [factory.env_fn(i) for i in range(3)], num_stages=2, autoreset_mode=AutoresetMode.SAME_STEP
    )
    expected = evaluate(policy, factory, torch.device("cpu"), 5, 100)  # type: ignore[arg-type]
    collector = DecoupledRolloutCollector(
        envs,
        policy,
        4,
        torch.device("cpu"),
        num_actors=2,
        noise_seed=1,
        timeout=60,
        steps_info_key=factory.steps_info_key,
        steps_per_decision=factory.steps_per_decision,
    )
    try:
        collector.reset(seed=0)
        collector.collect()
        got = collector.evaluate(factory, 5, 100)  # 5 episodes on 3 envs: two waves
        with pytest.raises(RuntimeError, match="reset"):
            collector.collect()  # the envs were left at the end of evaluation episodes
        again = collector.evaluate(factory, 2, 100, then_reset_seed=0)
        assert collector.collect().timings.decisions == 4 * 3
    finally:
        collector.close()
    assert got.lengths == expected.lengths == [2, 4, 6, 8, 10]
    np.testing.assert_allclose(got.returns, expected.returns, rtol=1e-6)
    assert got.successes == expected.successes is not None
    assert again.lengths == [2, 4] and again.returns == got.returns[:2]


# -- the trainer wired to the runner (--decoupled) --------------------------------------


def test_train_decoupled_tiny_run(tmp_path):
    config = TrainConfig(
        env_id="InvertedPendulum-v5",
        num_envs=3,
        num_stages=2,
        num_steps=8,
        total_timesteps=72,
        num_minibatches=4,
        update_epochs=1,
        eval_episodes=4,
        eval_every=1,
        eval_video=False,
        run_dir=str(tmp_path),
        run_name="run",
        progress=False,
        checkpoint_every=0,
        torch_threads=1,
        tensorboard=False,
        **{"decoupled": True, "num_actors": 2, "rollout_queue_size": 1, "max_wait": 0.001},
    )
    summary = train(config)
    assert summary["decoupled"] is True and summary["global_step"] == 72
    assert summary["iterations"] == 3
    # an evaluation after iterations 1 and 2 (then training went on), and the final one
    assert [e["iteration"] for e in summary["evaluations"]] == [1, 2, 3]
    assert all(e["episodes"] == 4 for e in summary["evaluations"])


@needs_libero
def test_train_libero_example_decoupled(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            *tiny_libero_args(
                tmp_path,
                "--from-scratch",
                "--decoupled",
                "--num-actors",
                "2",
                "--rollout-queue-size",
                "1",
                "--max-wait",
                "0.002",
                "--chunk-size",
                "4",
                "--run-name",
                "libero",
                eval_init_states="30:32",
            ),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "libero" / "summary.json").read_text())
    assert summary["decoupled"] is True and summary["global_step"] == 64
    assert summary["final_eval"]["episodes"] == 2 and "success_rate" in summary["final_eval"]
