"""Evaluate a saved policy (a BC or trainer checkpoint) as the trainer evaluates: on a
staged vector env's workers, deterministic episodes of the env factory's evaluation init
states, then optionally a video of episode 0."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from reference_trainer.envs import EnvFactory
from reference_trainer.layout import fixed_num_stages

__all__ = ["evaluate_checkpoint"]


def evaluate_checkpoint(
    config: Any,
    factory: EnvFactory,
    checkpoint: str,
    noise_seed: int | None = None,
    video: Path | None = None,
) -> dict[str, Any]:
    """Evaluate a BC or trainer checkpoint as the trainer does: ``config.eval_episodes``
    episodes of ``factory``'s evaluation init states on a 2-stage vector env's workers,
    then, with ``video``, record episode 0 into that mp4 as the trainer's final evaluation
    does (within what ``config.deadline`` leaves).

    The agent is built as the trainer builds it (`reference_trainer.training_run.build_agent`): a
    BC checkpoint gets ``--init-log-std-per-dim`` (the std RL starts from), a trainer
    checkpoint keeps the std it was trained to, and ``--explore-dims`` says which
    dimensions a sampled action perturbs.

    Args:
        config: the job's config (suite, tasks, features, init states, layout).
        factory: the env factory of ``config``.
        checkpoint: a ``bc.pt``, a trainer checkpoint or a run directory.
        noise_seed: None acts with the policy mean (the job's evaluations); an int samples
            actions as training does, the noise seeded with it.

    Returns:
        The evaluation's scalars (``success_rate``, ``return_mean``, ...), ``successes``
        (one bool per episode, episode ``j`` being task ``j % T``), ``wall_s`` (the
        workers' start and the video included: building LIBERO envs takes seconds),
        ``video`` (the mp4 written or None), ``video_s`` and ``checkpoint``.
    """
    import torch

    from reference_trainer.budget import record_video_by_deadline
    from reference_trainer.envs import make_vector_env
    from reference_trainer.rollout import RolloutCollector
    from reference_trainer.training_run import build_agent
    from reference_trainer.vector_eval import evaluate_on_vector_env

    device = torch.device("cpu")
    t0 = time.perf_counter()
    envs = make_vector_env(
        factory,
        config.num_envs,
        num_stages=fixed_num_stages(config),
        envs_per_worker=config.envs_per_worker,
    )
    try:
        agent = build_agent(
            config,
            envs.single_observation_space,
            envs.single_action_space,
            device,
            checkpoint,
            keep_trained_std=True,
        )
        collector = RolloutCollector(
            envs,
            agent,
            config.num_steps,
            device,
            steps_info_key=factory.steps_info_key,
            steps_per_decision=factory.steps_per_decision,
        )
        result = evaluate_on_vector_env(
            collector, factory, config.eval_episodes, config.eval_seed, noise_seed=noise_seed
        )
    finally:
        envs.close()
    written, video_s = (
        (None, 0.0)
        if video is None
        else record_video_by_deadline(agent, factory, device, video, config)
    )
    return {
        "iteration": 0,
        "global_step": 0,
        **result.as_scalars(),
        "successes": [bool(v) for v in result.successes or []],
        "wall_s": time.perf_counter() - t0,
        "video": written,
        "video_s": video_s,
        "checkpoint": checkpoint,
    }
