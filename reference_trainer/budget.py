"""The trainer's budget: when training stops for the final evaluation, when an evaluation
during training fits, and how long an evaluation and its video may take.

A run with a deadline (``--deadline``, a script's ``--budget-minutes``) keeps the time its
final evaluation (and video) needs: before every iteration `EvaluationPlan` asks whether
one more iteration and that evaluation still end before the deadline. The estimates come
from the run's own evaluations (`eval_estimate`, `video_estimate`).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from reference_trainer.agent import ActorCritic
from reference_trainer.config import TrainConfig
from reference_trainer.envs import EnvFactory
from reference_trainer.evaluation import record_video
from reference_trainer.rollout import Rollout

__all__ = [
    "FINISH_MARGIN_S",
    "EvaluationPlan",
    "during_episodes",
    "eval_estimate",
    "record_video_by_deadline",
    "video_estimate",
]

logger = logging.getLogger(__name__)

FINISH_MARGIN_S = 5.0
"""Seconds a deadline keeps spare after the final evaluation (its video included) to save
the run: checkpoint, summary, pictures."""


def past_deadline(deadline: float, iteration_s: float, final_eval_s: float) -> bool:
    """True when one more iteration and a final evaluation would end after ``deadline``."""
    return time.time() + iteration_s + final_eval_s + FINISH_MARGIN_S >= deadline


def eval_estimate(
    evaluations: list[dict[str, Any]],
    episodes: int,
    num_envs: int,
    longest_episode: int,
    env_steps_per_s: float | None,
) -> float:
    """Seconds the episodes of an evaluation of ``episodes`` may take (a video aside).

    With an evaluation of as many episodes measured: the longest such (its video left
    out) times 1.2 (one evaluation of 50 episodes took 1.4 times another of the same
    episodes, alone on a 2-core host), scaled up by how much longer the latest
    evaluation's episodes ran than the same episodes did in it (a policy that got worse
    plays longer, failing episodes). Without one: each env plays
    ``waves = ceil(episodes / num_envs)`` episodes in turn, so the longest evaluation of
    any size scaled to ``waves`` of its own, times 1.1, or, if longer, every env playing
    ``waves`` episodes at the longest episode length seen (in env steps) at the last
    rollout's throughput; 60 s per wave without any measurement.
    """
    waves = math.ceil(episodes / num_envs)
    alike = [e for e in evaluations if int(e.get("episodes", 0)) == episodes]
    if alike:
        reference = max(alike, key=lambda e: e.get("wall_s", 0.0) - e.get("video_s", 0.0))
        measured = reference.get("wall_s", 0.0) - reference.get("video_s", 0.0)
        return 1.2 * measured * _length_growth(reference, evaluations[-1])
    so_far = max(
        (
            (e.get("wall_s", 0.0) - e.get("video_s", 0.0))
            * waves
            / math.ceil(max(1, int(e.get("episodes", 1))) / num_envs)
            for e in evaluations
        ),
        default=0.0,
    )
    worst = 0.0
    if env_steps_per_s and longest_episode:
        worst = waves * longest_episode * num_envs / env_steps_per_s
    if not so_far and not worst:
        return 60.0 * waves
    return max(1.1 * so_far, worst)


def _length_growth(reference: dict[str, Any], latest: dict[str, Any]) -> float:
    """How many times longer (at least 1) the ``latest`` evaluation's episodes ran than
    the same episodes (its first ones) in ``reference``; 1 without per-episode lengths."""
    now, then = latest.get("lengths"), reference.get("lengths")
    if latest is reference or not now or not then or len(then) < len(now):
        return 1.0
    return max(1.0, sum(now) / max(1, sum(then[: len(now)])))


def video_estimate(evaluations: list[dict[str, Any]], config: TrainConfig) -> float:
    """Seconds the final evaluation's video may take: 1.2 times the longest recorded in the
    run, else ``config.eval_video_s``; 0 without ``--eval-video``."""
    if not config.eval_video:
        return 0.0
    measured = max((e.get("video_s", 0.0) for e in evaluations if e.get("video")), default=0.0)
    return 1.2 * measured if measured else config.eval_video_s


def record_video_by_deadline(
    agent: ActorCritic, factory: EnvFactory, device: torch.device, path: Path, config: TrainConfig
) -> tuple[str | None, float]:
    """Record evaluation episode 0 of ``factory`` into ``path`` (`evaluation.record_video`)
    within what ``config.deadline`` leaves, less `FINISH_MARGIN_S` to save the run (none
    with under a second left: a warning says so).

    Returns:
        The path written (None: no video) and the seconds it took.
    """
    start = time.perf_counter()
    max_s = None if config.deadline is None else config.deadline - time.time() - FINISH_MARGIN_S
    if max_s is not None and max_s < 1.0:
        logger.warning("no evaluation video: the deadline has passed")
        return None, 0.0
    written = record_video(agent, factory, device, path, config.eval_seed, config.video_fps, max_s)
    return written, time.perf_counter() - start


def during_episodes(config: TrainConfig) -> int:
    """Episodes of an evaluation during training: ``eval_during_episodes`` (0: all), at
    most ``eval_episodes``.

    Raises:
        ValueError: for ``eval_during_episodes < 0``.
    """
    if config.eval_during_episodes < 0:
        raise ValueError(
            f"eval_during_episodes: expected >= 0 (0: all --eval-episodes), "
            f"got {config.eval_during_episodes}"
        )
    if config.eval_during_episodes == 0:
        return config.eval_episodes
    return min(config.eval_during_episodes, config.eval_episodes)


class EvaluationPlan:
    """The training loop's budget: when to stop for the final evaluation, when an evaluation
    during training is due.

    Before each iteration `final_evaluation_next` plans the final evaluation (and its
    video) from the run's evaluations so far and says whether one more iteration would
    leave it too little time before ``config.deadline``. After each rollout
    `rollout_done` notes its longest episode and throughput (what an evaluation is
    planned from before one of its size was measured); `evaluation_due` says whether an
    evaluation of `during_episodes` episodes is due (``--eval-every`` iterations, or
    ``--eval-every-minutes`` after the last one when the deadline leaves it, the final
    evaluation and two more iterations room).

    Args:
        config: the run's config (deadline, evaluation sizes and intervals, video).
        evaluations: the run's evaluations so far, a list the run appends to.

    Raises:
        ValueError: for ``config.eval_during_episodes < 0`` (`during_episodes`).
    """

    def __init__(self, config: TrainConfig, evaluations: list[dict[str, Any]]) -> None:
        self.config = config
        self.during_episodes = during_episodes(config)
        self._evaluations = evaluations
        self._longest = max((int(e.get("length_max", 0)) for e in evaluations), default=0)
        self._recent_sps: float | None = None
        self._iteration_s = 0.0
        self._iteration_start: float | None = None
        self._final_eval_s = 0.0
        self._evaluated_at = time.perf_counter()

    @property
    def needed_s(self) -> float:
        """Seconds the last `final_evaluation_next` found one more iteration, the final
        evaluation (its video included) and the margin to save the run need."""
        return self._iteration_s + self._final_eval_s + FINISH_MARGIN_S

    def final_evaluation_s(self) -> float:
        """Seconds the final evaluation and its video are planned to take now."""
        config = self.config
        return eval_estimate(
            self._evaluations,
            config.eval_episodes,
            config.num_envs,
            self._longest,
            self._recent_sps,
        ) + video_estimate(self._evaluations, config)

    def final_evaluation_next(self) -> bool:
        """Called before each iteration: True when one more iteration (as long as the last)
        and the final evaluation would end after the deadline (never without one)."""
        now = time.perf_counter()
        if self._iteration_start is not None:
            self._iteration_s = now - self._iteration_start
        self._iteration_start = now
        self._final_eval_s = self.final_evaluation_s()
        deadline = self.config.deadline
        return deadline is not None and past_deadline(
            deadline, self._iteration_s, self._final_eval_s
        )

    def iterations_left(self) -> int | None:
        """Iterations as long as the last that still fit before the deadline with the final
        evaluation after them (None: no deadline, or no iteration timed yet)."""
        deadline = self.config.deadline
        if deadline is None or self._iteration_s <= 0:
            return None
        spare = deadline - time.time() - self._final_eval_s - FINISH_MARGIN_S
        return max(0, math.floor(spare / self._iteration_s))

    def rollout_done(self, rollout: Rollout) -> None:
        """Note the rollout's longest episode and its env steps per second."""
        self._longest = max([self._longest, *(r.length for r in rollout.episodes)])
        if rollout.timings.rollout_s > 0:
            self._recent_sps = rollout.timings.env_steps / rollout.timings.rollout_s

    def evaluation_due(self, iteration: int, num_iterations: int) -> bool:
        """An evaluation during training is due after ``iteration`` (of ``num_iterations``):
        every ``eval_every`` iterations, or ``eval_every_minutes`` after the last one when
        the deadline leaves it, the final evaluation and two more iterations room (one
        run right before the final evaluation would tell nothing the final does not; an
        evaluation took 1.6 times its plan)."""
        config = self.config
        if iteration >= num_iterations:
            return False
        if config.eval_every and iteration % config.eval_every == 0:
            return True
        if not config.eval_every_minutes:
            return False
        if time.perf_counter() - self._evaluated_at < 60 * config.eval_every_minutes:
            return False
        during_s = eval_estimate(
            self._evaluations,
            self.during_episodes,
            config.num_envs,
            self._longest,
            self._recent_sps,
        )
        needed_s = during_s + self._final_eval_s + 2 * self._iteration_s
        return config.deadline is None or time.time() + needed_s + FINISH_MARGIN_S < config.deadline

    def evaluated(self) -> None:
        """An evaluation during training just ended: the minutes count from now."""
        self._evaluated_at = time.perf_counter()
