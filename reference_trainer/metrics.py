"""Where rollout time went, and what the episodes achieved.

Time is split into three buckets measured on the trainer's host clock
(``time.perf_counter``):

* **inference**: the policy forward passes, including moving observations to the policy
  device and actions back (the ``.cpu()`` copy waits for the device, so CUDA time is in);
* **env wait**: time blocked in ``step_wait`` / ``wait_any`` / ``step`` for simulators;
* **env send**: time in ``step_async`` handing actions to the workers (pipelined loop;
  the serial loop's ``step`` counts as env wait);
* the rest is bookkeeping (buffer writes, episode statistics).

The **pipeline bubble** is the fraction of the rollout's wall time in which the policy
device sat idle: ``1 - inference / rollout``. A serial loop's bubble is the env share of
the time; a perfect pipeline (design notes: cost ``max(Te, Ti)`` instead of ``Te + Ti``)
drives it towards ``1 - Ti / max(Te, Ti)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "EpisodeRecord",
    "RolloutTimings",
    "ideal_pipelined_fraction",
    "summarize_episodes",
]


@dataclass
class RolloutTimings:
    """Timing of one rollout (seconds, host clock).

    Attributes:
        rollout_s: wall time of the whole rollout.
        env_wait_s: time blocked waiting for env results.
        env_send_s: time in ``step_async`` sending actions to the workers.
        inference_s: time in policy inference (incl. host/device copies).
        decisions: policy decisions taken (``num_steps * num_envs``).
        env_steps: primitive simulator steps taken (decisions times executed chunk length).
    """

    rollout_s: float = 0.0
    env_wait_s: float = 0.0
    env_send_s: float = 0.0
    inference_s: float = 0.0
    decisions: int = 0
    env_steps: int = 0

    @property
    def env_steps_per_s(self) -> float:
        """Primitive env steps per second of rollout wall time."""
        return self.env_steps / self.rollout_s if self.rollout_s > 0 else 0.0

    @property
    def bubble_fraction(self) -> float:
        """Fraction of the rollout in which the policy device was idle, in ``[0, 1]``."""
        if self.rollout_s <= 0:
            return 0.0
        return float(min(1.0, max(0.0, 1.0 - self.inference_s / self.rollout_s)))

    @property
    def overhead_s(self) -> float:
        """Rollout time in neither inference nor env calls (bookkeeping)."""
        return max(0.0, self.rollout_s - self.env_wait_s - self.env_send_s - self.inference_s)

    def as_scalars(self) -> dict[str, float]:
        """All fields and derived rates as a flat dict (TensorBoard / JSON)."""
        scalars = {key: float(value) for key, value in asdict(self).items()}
        scalars["env_steps_per_s"] = self.env_steps_per_s
        scalars["bubble_fraction"] = self.bubble_fraction
        scalars["overhead_s"] = self.overhead_s
        return scalars


@dataclass
class EpisodeRecord:
    """One finished episode.

    Attributes:
        env_index: global index of the env it ran in.
        decision_index: rollout step (decision) at which it ended.
        episode_return: sum of the rewards it was trained on (shaped or sparse).
        length: primitive env steps.
        success: whether ``info["is_success"]`` was true at any step; None when the env
            does not report success.
        terminated: True for a terminal state, False for a truncation.
    """

    env_index: int
    decision_index: int
    episode_return: float
    length: int
    success: bool | None
    terminated: bool


def summarize_episodes(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Mean return, length and sparse success rate of finished episodes.

    Args:
        records: finished episodes (possibly empty).

    Returns:
        ``episodes`` (count) and, when there is at least one episode, ``return_mean``,
        ``return_std``, ``length_mean``; ``success_rate`` when any episode reports success.
    """
    summary: dict[str, float] = {"episodes": float(len(records))}
    if not records:
        return summary
    returns = np.array([r.episode_return for r in records], dtype=np.float64)
    summary["return_mean"] = float(returns.mean())
    summary["return_std"] = float(returns.std())
    summary["length_mean"] = float(np.mean([r.length for r in records]))
    flags = [r.success for r in records if r.success is not None]
    if flags:
        summary["success_rate"] = float(np.mean(flags))
    return summary


def ideal_pipelined_fraction(env_time: float, inference_time: float) -> float:
    """The design notes' bound ``max(Te, Ti) / (Te + Ti)``: the best pipelined/serial time ratio.

    Args:
        env_time: env time per round ``Te`` (any unit).
        inference_time: inference time per round ``Ti`` (same unit).

    Returns:
        A ratio in ``[0.5, 1]``; its inverse is the best speed-up a pipeline can give.

    Raises:
        ValueError: if both times are zero or either is negative.

    Examples:
        >>> ideal_pipelined_fraction(10.0, 10.0)
        0.5
    """
    if env_time < 0 or inference_time < 0 or env_time + inference_time == 0:
        raise ValueError("times must be non-negative and not both zero")
    return max(env_time, inference_time) / (env_time + inference_time)
