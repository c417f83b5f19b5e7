"""Evaluation on the training vector env: fixed initial states, all workers in parallel.

Every training env is wrapped in `reference_trainer.scheduled_resets.ScheduledResets`. An evaluation resets env ``i`` with
``options={"reset_schedule": [...]}``, the list of ``(seed, options)`` of the evaluation
episodes it plays (episodes ``i, i + N, i + 2N, ...`` of ``N`` envs); its autoresets then
follow that list. The rollout collector runs deterministic rollouts (the policy mean, the
same pipelined stage loop as training) until every env has finished its share, and the
first ``len(schedule)`` episodes of each env are the evaluation's. A later plain reset
(training) clears the schedules. So an evaluation of ``E`` episodes costs about
``E / N`` episode times instead of ``E``, and builds no env.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reference_trainer.envs import EnvFactory
from reference_trainer.evaluation import EvalResult
from reference_trainer.rollout import RolloutCollector
from reference_trainer.scheduled_resets import SCHEDULE_KEY

__all__ = ["evaluate_on_vector_env"]


def evaluate_on_vector_env(
    collector: RolloutCollector,
    factory: EnvFactory,
    episodes: int,
    eval_seed: int,
    *,
    then_reset_seed: int | None = None,
    max_rollouts: int = 10_000,
    on_rollout: Callable[[int], None] | None = None,
) -> EvalResult:
    """Run ``episodes`` deterministic episodes on the collector's (training) envs.

    Episode ``j`` is reset with ``seed = eval_seed + j`` and
    ``factory.eval_reset_options(j)`` (as in `reference_trainer.evaluation.evaluate`) and
    is played by env ``j % N``. The envs must be wrapped in `reference_trainer.scheduled_resets.ScheduledResets` (the
    trainer's `make_vector_env` does it).

    Args:
        collector: the training rollout collector (its policy is evaluated).
        factory: gives the per-episode reset options.
        episodes: number of episodes (>= 1).
        eval_seed: seed of episode 0.
        then_reset_seed: reset the envs for training afterwards with this seed (env ``i``
            gets ``seed + i``); None leaves them as they are.
        max_rollouts: bound on the deterministic rollouts run (an env that never ends an
            episode raises instead of hanging).
        on_rollout: called after each deterministic rollout with the number of the
            evaluation's episodes finished so far (e.g. to show progress).

    Returns:
        Per-episode returns, primitive lengths and successes, in episode order.

    Raises:
        ValueError: for ``episodes < 1``.
        RuntimeError: if the episodes did not end within ``max_rollouts`` rollouts.
    """
    if episodes < 1:
        raise ValueError(f"episodes: expected >= 1, got {episodes}")
    n = collector.num_envs
    schedules = [
        [(eval_seed + j, factory.eval_reset_options(j)) for j in range(i, episodes, n)]
        for i in range(n)
    ]
    options = [{SCHEDULE_KEY: s} if s else None for s in schedules]
    collector.reset(options=options)
    finished: list[list[Any]] = [[] for _ in range(n)]
    for _ in range(max_rollouts):
        rollout = collector.collect(deterministic=True)
        for record in rollout.episodes:
            if len(finished[record.env_index]) < len(schedules[record.env_index]):
                finished[record.env_index].append(record)
        if on_rollout is not None:
            on_rollout(sum(len(f) for f in finished))
        if all(len(f) == len(s) for f, s in zip(finished, schedules, strict=True)):
            break
    else:
        raise RuntimeError(
            f"evaluation: {episodes} episodes did not end in {max_rollouts} rollouts"
        )
    result = EvalResult()
    ordered = [finished[j % n][j // n] for j in range(episodes)]
    result.returns = [r.episode_return for r in ordered]
    result.lengths = [r.length for r in ordered]
    if all(r.success is not None for r in ordered):
        result.successes = [bool(r.success) for r in ordered]
    if then_reset_seed is not None:
        collector.reset(seed=then_reset_seed)
    return result
