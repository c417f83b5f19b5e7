"""Stable-Baselines3 PPO on a PipelinedVectorEnv through the ``SB3VecEnv`` adapter.

The adapter is a drop-in for SB3's ``SubprocVecEnv``: the only line that changes is the
one that builds the vector env. SB3's vec-env wrappers (``VecMonitor``, ``VecNormalize``,
``VecFrameStack``) go on top as usual.

Run:
    python examples/sb3_ppo.py                                   # CartPole-v1, 20k steps
    python examples/sb3_ppo.py --env-id HalfCheetah-v5 --total-timesteps 1000000 --normalize
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import tyro


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """gymnasium id of the task"""
    num_envs: int = 8
    """parallel envs"""
    envs_per_worker: int = 4
    """envs per worker process (fewer processes, fewer messages per step)"""
    total_timesteps: int = 20_000
    """env steps to train for"""
    normalize: bool = False
    """wrap in VecNormalize (observations and rewards), as for MuJoCo tasks"""
    seed: int = 0
    """seed of PPO and of the envs"""
    eval_episodes: int = 10
    """episodes of the final deterministic evaluation"""


def main(args: Args) -> float:
    # torch and SB3 are imported here, not at the top: the workers (forkserver) import this
    # script as their ``__main__`` and need neither.
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecMonitor, VecNormalize

    from pipelined_vec_env.sb3 import SB3VecEnv

    env_id = args.env_id
    venv = SB3VecEnv(  # was: SubprocVecEnv([...])
        [lambda: gym.make(env_id) for _ in range(args.num_envs)],
        envs_per_worker=args.envs_per_worker,
    )
    venv = VecMonitor(venv)
    if args.normalize:
        venv = VecNormalize(venv)
    try:
        venv.seed(args.seed)
        if env_id == "CartPole-v1":  # tuned for CartPole (solves it in ~10k steps)
            hyper = dict(
                n_steps=32,
                batch_size=min(256, 32 * args.num_envs),
                n_epochs=10,
                gae_lambda=0.8,
                gamma=0.98,
                learning_rate=1e-3,
            )
        else:
            hyper = {}
        model = PPO("MlpPolicy", venv, seed=args.seed, verbose=1, device="cpu", **hyper)
        model.learn(args.total_timesteps)
        if args.normalize:
            venv.training = False  # freeze the statistics for evaluation
            venv.norm_reward = False
        mean_return, std_return = evaluate_policy(
            model, venv, n_eval_episodes=args.eval_episodes, deterministic=True
        )
        print(
            f"mean return over {args.eval_episodes} episodes: {mean_return:.1f} +/- {std_return:.1f}"
        )
        return float(mean_return)
    finally:
        venv.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
