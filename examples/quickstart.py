"""Quickstart: a pipelined rollout with two stages.

While stage 0's simulators step in their worker processes, the policy infers for stage 1,
and the other way round. Run: ``python examples/quickstart.py``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.wrappers import RecordEpisodeStatistics


def make_env():
    return gym.make("CartPole-v1")


RNG = np.random.default_rng(0)


def policy(obs: np.ndarray) -> np.ndarray:
    """A noisy hand-written controller: push the cart towards where the pole leans,
    with one action in four random."""
    greedy = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
    random = RNG.integers(0, 2, size=len(obs))
    return np.where(RNG.random(len(obs)) < 0.25, random, greedy)


def main(num_envs: int = 8, num_stages: int = 2, rounds: int = 300) -> list[float]:
    """Run ``rounds`` pipelined steps per stage; return the finished episodes' returns."""
    envs = RecordEpisodeStatistics(
        PipelinedVectorEnv(
            [make_env for _ in range(num_envs)], num_stages=num_stages, envs_per_worker=2
        )
    )
    try:
        obs, _ = envs.reset(seed=0)
        stage_obs = [obs[s] for s in envs.stage_slices]
        for s in range(num_stages):  # fill the pipeline: every stage gets its first actions
            envs.step_async(policy(stage_obs[s]), stage=s)
        for _ in range(rounds):
            for s in range(num_stages):
                # stage s's results; the other stages keep stepping meanwhile
                stage_obs[s], _, _, _, _ = envs.step_wait(stage=s)
                envs.step_async(policy(stage_obs[s]), stage=s)
        for s in range(num_stages):  # drain the pipeline
            envs.step_wait(stage=s)
        returns = list(envs.return_queue)
    finally:
        envs.close()
    print(f"{len(returns)} episodes finished, mean return {np.mean(returns):.1f}")
    return returns


if __name__ == "__main__":
    main()
