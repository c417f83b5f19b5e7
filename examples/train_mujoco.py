"""Train the reference PPO on a gymnasium MuJoCo task (default: HalfCheetah-v5, 1M steps).

The learning check of the trainer: same code path as ``train_libero.py`` (staged
``PipelinedVectorEnv``, pipelined rollout), on a task with published PPO baselines.

Usage::

    python examples/train_mujoco.py                       # HalfCheetah-v5, 1M env steps
    python examples/train_mujoco.py --env-id InvertedPendulum-v5 --total-timesteps 100000
    python examples/train_mujoco.py --help                # every TrainConfig field

Defaults follow the usual MuJoCo PPO settings (Schulman et al. 2017; 2048 decisions per
rollout, 10 epochs, 32 minibatches, lr 3e-4 annealed, observation and reward
normalisation); the rollout is spread over 8 envs in 2 pipeline stages.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import tyro

from reference_trainer.config import TrainConfig
from reference_trainer.train import train

DEFAULTS = TrainConfig(
    env_id="HalfCheetah-v5",
    num_envs=8,
    num_stages=2,
    total_timesteps=1_000_000,
    num_steps=256,
    eval_episodes=10,
    checkpoint_every=50,
)


def main() -> None:
    """Parse the config (defaults above), train, and print the headline numbers."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = tyro.cli(TrainConfig, default=dataclasses.replace(DEFAULTS))
    summary = train(config)
    headline = {
        "run_dir": summary["run_dir"],
        "global_step": summary["global_step"],
        "wall_s": round(summary["wall_s"], 1),
        "train_return_start": summary["return_start"],
        "train_return_end": summary["return_end"],
        "eval_return_mean": (summary["final_eval"] or {}).get("return_mean"),
        "env_steps_per_s_overall": summary["throughput"]["env_steps_per_s_overall"],
    }
    print(json.dumps(headline, indent=2))


if __name__ == "__main__":
    main()
