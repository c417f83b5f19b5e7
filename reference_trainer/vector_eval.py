"""Evaluation on the training vector env: fixed initial states, all workers in parallel.

Every training env is wrapped in `reference_trainer.scheduled_resets.ScheduledResets`. An
evaluation resets env ``i`` with ``options={"reset_schedule": [...]}``, the list of
``(seed, options)`` of the evaluation episodes it plays; its autoresets then follow that
list. The rollout collector runs deterministic rollouts (the policy mean, the same
pipelined stage loop as training; or, with ``noise_seed``, the policy's sampled actions
with the exploration noise drawn from a generator seeded with it) until every episode has
ended. A later plain reset (training) clears the schedules. So an evaluation of ``E``
episodes costs about ``E / N`` episode times instead of ``E``, and builds no env.

Episodes go to the envs dynamically (``assignment="dynamic"``, where the vector env has
``call_at``): env ``i`` starts with episode ``i`` and one queued behind it (``N + i``);
after every rollout each env whose queue is empty gets the next unassigned episode
(``ScheduledResets.extend_schedule``), and an env with nothing left parks, stepping
nothing, so the busy envs get the cores. Which env plays an episode depends only on the
episodes' lengths in decisions, so it is the same in every run, and an episode's outcome
depends only on its seed, reset options and the policy, never on the env playing it.
``"static"``: env ``i`` plays episodes ``i, i + N, i + 2N, ...`` and keeps stepping
non-evaluation episodes once done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from reference_trainer.envs import EnvFactory
from reference_trainer.evaluation import EvalResult
from reference_trainer.metrics import EpisodeRecord
from reference_trainer.rollout import RolloutCollector
from reference_trainer.scheduled_resets import PARK_KEY, SCHEDULE_KEY

__all__ = ["evaluate_on_vector_env"]

QUEUED = 1
"""Episodes each env keeps queued behind the one it plays (dynamic assignment)."""


def evaluate_on_vector_env(
    collector: RolloutCollector,
    factory: EnvFactory,
    episodes: int,
    eval_seed: int,
    *,
    then_reset_seed: int | None = None,
    max_rollouts: int = 10_000,
    on_rollout: Callable[[int], None] | None = None,
    assignment: Literal["dynamic", "static"] = "dynamic",
    noise_seed: int | None = None,
) -> EvalResult:
    """Run ``episodes`` evaluation episodes on the collector's (training) envs, with the
    policy mean unless ``noise_seed`` is given.

    Episode ``j`` is reset with ``seed = eval_seed + j`` and
    ``factory.eval_reset_options(j)`` (as in `reference_trainer.evaluation.evaluate`);
    the envs play them as ``assignment`` says (see the module docstring). The envs must
    be wrapped in `reference_trainer.scheduled_resets.ScheduledResets` (the trainer's
    `make_vector_env` does it).

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
        assignment: ``"dynamic"`` (the next episode to the env that frees up; static
            where the vector env has no ``call_at``) or ``"static"`` (env ``j % N``).
        noise_seed: None acts with the policy mean. An int acts as training does, mean
            plus exploration noise along the agent's exploring dimensions, the noise drawn
            from the collector's generator reseeded with it (the same episodes for the
            same seed); the generator's training state is restored afterwards.

    Returns:
        Per-episode returns, primitive lengths and successes, in episode order.

    Raises:
        ValueError: for ``episodes < 1`` or an unknown ``assignment``.
        RuntimeError: if the episodes did not end within ``max_rollouts`` rollouts.
    """
    if episodes < 1:
        raise ValueError(f"episodes: expected >= 1, got {episodes}")
    if assignment not in ("dynamic", "static"):
        raise ValueError(f"assignment: expected 'dynamic' or 'static', got {assignment!r}")
    deterministic = noise_seed is None
    training_noise = collector.generator_state()
    if noise_seed is not None:
        collector.generator.manual_seed(int(noise_seed))
    try:
        play = (
            _play_dynamic
            if assignment == "dynamic" and callable(getattr(collector.envs, "call_at", None))
            else _play_static
        )
        ordered = play(
            collector, factory, episodes, eval_seed, max_rollouts, on_rollout, deterministic
        )
    finally:
        collector.set_generator_state(training_noise)
    result = EvalResult()
    result.returns = [r.episode_return for r in ordered]
    result.lengths = [r.length for r in ordered]
    if all(r.success is not None for r in ordered):
        result.successes = [bool(r.success) for r in ordered]
    if then_reset_seed is not None:
        collector.reset(seed=then_reset_seed)
    return result


def _play_static(
    collector: RolloutCollector,
    factory: EnvFactory,
    episodes: int,
    eval_seed: int,
    max_rollouts: int,
    on_rollout: Callable[[int], None] | None,
    deterministic: bool,
) -> list[EpisodeRecord]:
    """Env ``i`` plays episodes ``i, i + N, ...``; the records in episode order."""
    n = collector.num_envs
    schedules = [
        [(eval_seed + j, factory.eval_reset_options(j)) for j in range(i, episodes, n)]
        for i in range(n)
    ]
    options = [{SCHEDULE_KEY: s} if s else None for s in schedules]
    collector.reset(options=options)
    finished: list[list[Any]] = [[] for _ in range(n)]
    for _ in range(max_rollouts):
        rollout = collector.collect(deterministic=deterministic)
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
    return [finished[j % n][j // n] for j in range(episodes)]


def _play_dynamic(
    collector: RolloutCollector,
    factory: EnvFactory,
    episodes: int,
    eval_seed: int,
    max_rollouts: int,
    on_rollout: Callable[[int], None] | None,
    deterministic: bool,
) -> list[EpisodeRecord]:
    """The next episode to the env that frees up (see the module docstring); the
    records in episode order."""
    n = collector.num_envs

    def reset_of(j: int) -> tuple[int, dict[str, Any] | None]:
        return eval_seed + j, factory.eval_reset_options(j)

    assigned: list[list[int]] = [[] for _ in range(n)]
    for j in range(min(episodes, n * (1 + QUEUED))):
        assigned[j % n].append(j)
    collector.reset(
        options=[{SCHEDULE_KEY: [reset_of(j) for j in a], PARK_KEY: True} for a in assigned]
    )
    finished: list[list[EpisodeRecord]] = [[] for _ in range(n)]
    skip = [0] * n  # the 0-reward step that ends a parked stretch is no episode
    next_episode = sum(len(a) for a in assigned)
    for _ in range(max_rollouts):
        for record in collector.collect(deterministic=deterministic).episodes:
            i = record.env_index
            if skip[i]:
                skip[i] -= 1
            elif len(finished[i]) < len(assigned[i]):
                finished[i].append(record)
        done = sum(len(f) for f in finished)
        if on_rollout is not None:
            on_rollout(done)
        if done == episodes:
            break
        for i in range(n):
            playing = len(finished[i]) < len(assigned[i])
            wanted = QUEUED - (len(assigned[i]) - len(finished[i]) - 1) if playing else 1 + QUEUED
            new = list(range(next_episode, min(episodes, next_episode + max(0, wanted))))
            if not new:
                continue
            next_episode += len(new)
            collector.envs.call_at([i], "extend_schedule", [reset_of(j) for j in new])
            assigned[i].extend(new)
            skip[i] += 0 if playing else 1
    else:
        raise RuntimeError(
            f"evaluation: {episodes} episodes did not end in {max_rollouts} rollouts"
        )
    by_episode = {
        j: r for a, f in zip(assigned, finished, strict=True) for j, r in zip(a, f, strict=True)
    }
    return [by_episode[j] for j in range(episodes)]
