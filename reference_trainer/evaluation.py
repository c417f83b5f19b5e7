"""Deterministic evaluation over fixed initial states, with an optional mp4 video.

Episode ``j`` is reset with ``seed = eval_seed + j`` and the factory's
``eval_reset_options(j)`` (LIBERO: init state ``j``), so every evaluation of a run, and of
different runs, starts from the same states. The policy acts with its mean. `evaluate`
runs in the calling process on one env; the trainer itself evaluates on its training envs'
workers in parallel (`reference_trainer.vector_eval`). A video episode uses an env built
with ``render_mode="rgb_array"``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from reference_trainer.agent import ActorCritic, obs_to_tensor
from reference_trainer.envs import EnvFactory

__all__ = ["EvalResult", "evaluate", "record_video"]

logger = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """Outcome of an evaluation.

    Attributes:
        returns: per-episode return (the trained-on reward).
        lengths: per-episode primitive steps.
        successes: per-episode sparse success, or None when the env reports none.
        video_path: the mp4 written, or None.
    """

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    successes: list[bool] | None = None
    video_path: str | None = None

    def as_scalars(self) -> dict[str, float]:
        """Means for logging: ``return_mean``, ``length_mean``, ``success_rate`` if known."""
        scalars = {
            "episodes": float(len(self.returns)),
            "return_mean": float(np.mean(self.returns)) if self.returns else float("nan"),
            "length_mean": float(np.mean(self.lengths)) if self.lengths else float("nan"),
        }
        if self.successes is not None:
            scalars["success_rate"] = float(np.mean(self.successes))
        return scalars


def _single_obs_batch(obs: Any) -> Any:
    if isinstance(obs, dict):
        return {key: np.asarray(value)[None] for key, value in obs.items()}
    return np.asarray(obs)[None]


class _Episode(NamedTuple):
    """One episode's outcome: return, length in env steps, success (None: the env does not
    report it) and whether ``stop_at`` ended it before the env did."""

    total: float
    length: int
    success: bool | None
    cut: bool


def _run_episode(
    env: gym.Env,
    agent: ActorCritic,
    device: torch.device,
    seed: int,
    options: dict[str, Any] | None,
    steps_info_key: str | None,
    steps_per_decision: int,
    frames: list[np.ndarray] | None = None,
    stop_at: float | None = None,
) -> _Episode:
    """One deterministic episode. With ``stop_at`` (a ``time.perf_counter()`` value) the
    episode ends early, as truncated and ``cut``, once that time has passed."""
    space = env.action_space
    assert isinstance(space, gym.spaces.Box)
    obs, info = env.reset(seed=seed, options=options)
    if frames is not None:
        frames.append(np.asarray(env.render()))
    total, length, success, reports = 0.0, 0, False, "is_success" in info
    while True:
        with torch.no_grad():
            out = agent.act(obs_to_tensor(_single_obs_batch(obs), device), None)
        action = np.clip(out.action[0].cpu().numpy(), space.low, space.high)
        obs, reward, terminated, truncated, info = env.step(action)
        if frames is not None:
            frames.append(np.asarray(env.render()))
        total += float(reward)
        length += (
            int(info.get(steps_info_key, steps_per_decision))
            if steps_info_key
            else steps_per_decision
        )
        if "is_success" in info:
            reports = True
            success |= bool(info["is_success"])
        ended = bool(terminated or truncated)
        cut = not ended and stop_at is not None and time.perf_counter() >= stop_at
        if ended or cut:
            return _Episode(total, length, success if reports else None, cut)


def evaluate(
    agent: ActorCritic,
    factory: EnvFactory,
    device: torch.device,
    episodes: int,
    eval_seed: int,
) -> EvalResult:
    """Run ``episodes`` deterministic episodes from fixed initial states.

    Args:
        agent: the policy (put in eval mode by the caller if it matters).
        factory: builds the env and gives per-episode reset options.
        device: the policy device.
        episodes: number of episodes.
        eval_seed: episode ``j`` is reset with seed ``eval_seed + j``.

    Returns:
        The per-episode returns, lengths and successes.
    """
    env = factory.env_fn(0)()
    result = EvalResult()
    successes: list[bool | None] = []
    try:
        for j in range(episodes):
            episode = _run_episode(
                env,
                agent,
                device,
                eval_seed + j,
                factory.eval_reset_options(j),
                factory.steps_info_key,
                factory.steps_per_decision,
            )
            result.returns.append(episode.total)
            result.lengths.append(episode.length)
            successes.append(episode.success)
    finally:
        env.close()
    if successes and all(s is not None for s in successes):
        result.successes = [bool(s) for s in successes]
    return result


def record_video(
    agent: ActorCritic,
    factory: EnvFactory,
    device: torch.device,
    path: Path,
    eval_seed: int,
    fps: int,
    max_s: float | None = None,
) -> str | None:
    """Record evaluation episode 0 as an mp4.

    Rendering needs an offscreen OpenGL (``MUJOCO_GL=egl`` or ``osmesa``); when it is not
    available the failure is logged and None returned, so training results are not lost.

    Args:
        agent: the policy.
        factory: builds a rendering env with ``env_fn(0, render=True)``.
        device: the policy device.
        path: the mp4 to write (parent directories are created).
        eval_seed: the seed of evaluation episode 0.
        fps: frames per second.
        max_s: seconds the recording may take (None: no limit); past them the episode's
            video ends where it is (a warning says so), so a deadline holds.

    Returns:
        The path written, or None if rendering or encoding failed.
    """
    frames: list[np.ndarray] = []
    env = None
    try:
        import imageio.v2 as imageio

        start = time.perf_counter()
        stop_at = None if max_s is None else start + max_s
        env = factory.env_fn(0, render=True)()
        episode = _run_episode(
            env,
            agent,
            device,
            eval_seed,
            factory.eval_reset_options(0),
            factory.steps_info_key,
            factory.steps_per_decision,
            frames,
            stop_at,
        )
        if episode.cut:
            logger.warning(
                "evaluation video cut at %d frames: its %.0f s ran out", len(frames), max_s
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        imageio.mimsave(path, [np.ascontiguousarray(f, dtype=np.uint8) for f in frames], fps=fps)
        return str(path)
    except Exception as exc:  # rendering depends on the machine's OpenGL; never fail training
        logger.warning("evaluation video skipped: %s: %s", type(exc).__name__, exc)
        return None
    finally:
        if env is not None:
            try:
                env.close()
            except Exception as exc:  # a half-built renderer may fail to close
                logger.debug("closing the video env failed: %s", exc)
