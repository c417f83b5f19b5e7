"""Train the reference PPO on one LIBERO task with a 2-stage pipelined rollout.

With no arguments this is a ~10-minute CPU run (2 cores are enough): one libero_object
task, 4 state-only envs in 2 pipeline stages, action chunks of 4, dense goal shaping,
7.5 minutes of training. It
shows progress, evaluates from fixed init states at the end (sparse success rate, plus an
mp4 when offscreen OpenGL is available), and prints the run directory, the shaped return
curve's start and end, the success rate and the throughput.

A 10-minute CPU run shows learning signal in the shaped return, not solved tasks: expect
a success rate near 0. A real run wants many more envs, stages and steps, usually
cameras, and a GPU for the policy, e.g.::

    python examples/train_libero.py --num-envs 32 --num-stages 4 --envs-per-worker 2 \
        --total-timesteps 5000000 --cameras agentview wrist --chunk-size 8 \
        --hidden-sizes 256 256 --max-minutes None --eval-every 50

Every ``TrainConfig`` field is a flag (``--help``), plus the LIBERO ones below.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import tyro

from reference_trainer.config import TrainConfig
from reference_trainer.train import train


@dataclass
class LiberoTrainConfig(TrainConfig):
    """PPO on one LIBERO task (defaults: a ~10-minute run on a 2-core CPU)."""

    env_id: str = "libero"
    """Label of the run (the env comes from --suite and --task-id)."""
    suite: Literal["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"] = (
        "libero_object"
    )
    """LIBERO suite."""
    task_id: int = 0
    """Task index within the suite."""
    chunk_size: int = 4
    """Actions per policy decision (action chunk K), executed inside the env worker."""
    cameras: tuple[Literal["agentview", "wrist"], ...] = ()
    """Camera observations for the CNN (empty: state only, ~10x faster on CPU)."""
    image_size: int = 128
    """Camera image side in pixels."""
    dense_reward: bool = True
    """Train on dense goal shaping (success is always logged from the sparse signal)."""
    shaping_scale: float = 1.0
    """Multiplier of the shaping term."""
    horizon: int | None = None
    """Primitive steps before truncation (None: the suite's evaluation horizon)."""

    num_envs: int = 4
    num_stages: int = 2
    num_steps: int = 32
    total_timesteps: int = 60_000
    num_minibatches: int = 4
    update_epochs: int = 10
    hidden_sizes: tuple[int, ...] = (128, 128)
    init_log_std: float = -0.5
    max_minutes: float | None = 7.5
    eval_episodes: int = 5
    video_fps: int = 5
    checkpoint_every: int = 20


def _make_libero_env(
    suite: str,
    task_id: int,
    chunk_size: int,
    cameras: tuple[str, ...],
    image_size: int,
    reward_type: str,
    shaping_scale: float,
    horizon: int | None,
    render: bool,
) -> gym.Env:
    from pipelined_vec_env.libero.env import LiberoEnv
    from pipelined_vec_env.wrappers.action_chunk import ActionChunk

    env = LiberoEnv(
        suite,
        task_id,
        cameras=cameras,
        image_size=image_size,
        reward_type=reward_type,
        shaping_scale=shaping_scale,
        horizon=horizon,
        render_mode="rgb_array" if render else None,
    )
    return ActionChunk(env, chunk_size)


@dataclass
class LiberoEnvFactory:
    """The LIBERO part of the trainer: build chunked LIBERO envs, fix eval init states."""

    config: LiberoTrainConfig
    steps_info_key: str | None = "chunk_steps_executed"

    @property
    def steps_per_decision(self) -> int:
        """Primitive steps per decision: the chunk length."""
        return self.config.chunk_size

    def env_fn(self, index: int, *, render: bool = False) -> Callable[[], gym.Env]:
        """Constructor of env ``index`` (init states come from the reset seed)."""
        c = self.config
        return functools.partial(
            _make_libero_env,
            c.suite,
            c.task_id,
            c.chunk_size,
            tuple(c.cameras),
            c.image_size,
            "dense" if c.dense_reward else "sparse",
            c.shaping_scale,
            c.horizon,
            render,
        )

    def eval_reset_options(self, episode: int) -> dict[str, Any] | None:
        """Evaluation episode ``j`` starts from the benchmark's init state ``j``."""
        return {"init_state_id": episode % 50}


def main() -> None:
    """Parse the config, train, and print the run's headline numbers."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = tyro.cli(LiberoTrainConfig)
    if config.eval_video or config.cameras:
        # headless rendering; an explicit MUJOCO_GL (e.g. osmesa) wins
        os.environ.setdefault("MUJOCO_GL", "egl")
    if config.run_name is None:
        config = dataclasses.replace(
            config, run_name=f"{config.suite}_task{config.task_id}__s{config.seed}__{os.getpid()}"
        )
    summary = train(config, LiberoEnvFactory(config))

    final = summary["final_eval"] or {}
    throughput = summary["throughput"]

    def fmt(value: float | None, spec: str = ".3f") -> str:
        return "n/a" if value is None else format(value, spec)

    print()
    print(f"run directory:        {summary['run_dir']}")
    print(
        f"shaped return:        {fmt(summary['return_start'])} (start) -> "
        f"{fmt(summary['return_end'])} (end), per episode"
    )
    print(
        f"success rate:         {fmt(final.get('success_rate'), '.2f')} over "
        f"{int(final.get('episodes', 0))} eval episodes from fixed init states; "
        f"training episodes at the end: {fmt(summary['train_success_rate_end'], '.2f')}"
    )
    print(
        f"throughput:           {fmt(throughput['env_steps_per_s_rollout'], '.1f')} env steps/s "
        f"in rollouts, {fmt(throughput['env_steps_per_s_overall'], '.1f')} overall; "
        f"policy idle (bubble) {fmt(throughput['bubble_fraction'], '.2f')}"
    )
    print(f"env steps, wall time: {summary['global_step']}, {summary['wall_s']:.0f} s")
    if final.get("video"):
        print(f"video:                {final['video']}")
    print(json.dumps({"summary": os.path.join(summary["run_dir"], "summary.json")}))


if __name__ == "__main__":
    main()
