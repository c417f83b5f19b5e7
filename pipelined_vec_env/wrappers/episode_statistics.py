"""Episode statistics that also see per-stage calls.

gymnasium's vector wrappers only see whole-env calls (``reset``/``step``); a per-stage
``step_async(actions, stage)`` / ``step_wait(stage)`` on ``envs.unwrapped`` bypasses them.
This wrapper records the same statistics as
`gymnasium.wrappers.vector.RecordEpisodeStatistics` (same ``info["episode"]``
layout, same queues) for both whole-env and per-stage calls.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

__all__ = ["RecordEpisodeStatistics"]


class RecordEpisodeStatistics(VectorWrapper):
    """Track episode returns, lengths and durations per env, for whole-env and stage calls.

    When an env's episode ends, the batch's info gets ``info[stats_key] = {"r", "l", "t"}``
    (float64 return, int length in steps, float64 duration in seconds; zero for envs whose
    episode did not end) and the mask ``info["_" + stats_key]``, exactly as gymnasium's
    ``RecordEpisodeStatistics``. For a stage call the arrays cover only that stage's envs.
    Autoreset steps (``NEXT_STEP``) do not count towards the next episode.

    Args:
        env: A [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] (or a wrapper of one that
            forwards stage calls, such as this class).
        buffer_length: Length of `return_queue`, `length_queue`,
            `time_queue`.
        stats_key: Info key for the statistics.

    Raises:
        ValueError: ``stats_key`` already present in an info batch.
    """

    def __init__(
        self, env: VectorEnv, buffer_length: int = 100, stats_key: str = "episode"
    ) -> None:
        super().__init__(env)
        self._stats_key = stats_key
        self._autoreset_mode = self.env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        n = self.num_envs
        self.episode_count = 0
        self.episode_start_times = np.full(n, time.perf_counter())
        self.episode_returns = np.zeros(n)
        self.episode_lengths = np.zeros(n, dtype=int)
        self.prev_dones = np.zeros(n, dtype=bool)
        self.time_queue: deque[float] = deque(maxlen=buffer_length)
        self.return_queue: deque[float] = deque(maxlen=buffer_length)
        self.length_queue: deque[int] = deque(maxlen=buffer_length)
        self._reset_masks: dict[int | None, np.ndarray | None] = {}

    @property
    def stage_slices(self) -> tuple[slice, ...]:
        """The wrapped env's stage slices (global env indices)."""
        return self.env.stage_slices

    def _envs(self, stage: int | None) -> slice:
        return slice(0, self.num_envs) if stage is None else self.env.stage_slices[stage]

    def _start(self, envs: slice, mask: np.ndarray | None) -> None:
        idx = np.arange(envs.start, envs.stop)
        if mask is not None:
            idx = idx[mask]
        self.episode_start_times[idx] = time.perf_counter()
        self.episode_returns[idx] = 0.0
        self.episode_lengths[idx] = 0
        self.prev_dones[idx] = False

    def _record(
        self,
        envs: slice,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        infos: dict[str, Any],
    ) -> dict[str, Any]:
        returns = self.episode_returns[envs]
        lengths = self.episode_lengths[envs]
        starts = self.episode_start_times[envs]
        prev = self.prev_dones[envs]
        if self._autoreset_mode == AutoresetMode.NEXT_STEP:
            returns[prev], lengths[prev], starts[prev] = 0.0, 0, time.perf_counter()
            returns[~prev] += rewards[~prev]
            lengths[~prev] += 1
        else:
            returns += rewards
            lengths += 1
        dones = np.logical_or(terminations, truncations)
        self.prev_dones[envs] = dones
        if dones.any():
            if self._stats_key in infos or f"_{self._stats_key}" in infos:
                raise ValueError(
                    f"stats_key {self._stats_key!r} is already in info: {sorted(infos)}"
                )
            durations = np.round(time.perf_counter() - starts, 6)
            infos[self._stats_key] = {
                "r": np.where(dones, returns, 0.0),
                "l": np.where(dones, lengths, 0),
                "t": np.where(dones, durations, 0.0),
            }
            infos[f"_{self._stats_key}"] = dones
            for i in np.flatnonzero(dones):
                self.episode_count += 1
                self.return_queue.append(float(returns[i]))
                self.length_queue.append(int(lengths[i]))
                self.time_queue.append(float(durations[i]))
            if self._autoreset_mode == AutoresetMode.SAME_STEP:
                returns[dones], lengths[dones], starts[dones] = 0.0, 0, time.perf_counter()
        return infos

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        """Reset all envs and their statistics (only the masked ones with ``reset_mask``)."""
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, seed: Any = None, options: Any = None, stage: int | None = None) -> None:
        """Forward [`PipelinedVectorEnv.reset_async`][pipelined_vec_env.PipelinedVectorEnv.reset_async]."""
        self._reset_masks[stage] = options.get("reset_mask") if isinstance(options, dict) else None
        self.env.reset_async(seed=seed, options=options, stage=stage)

    def reset_wait(
        self, stage: int | None = None, timeout: float | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Forward [`PipelinedVectorEnv.reset_wait`][pipelined_vec_env.PipelinedVectorEnv.reset_wait] and restart the reset envs' episodes."""
        obs, infos = self.env.reset_wait(stage=stage, timeout=timeout)
        self._start(self._envs(stage), self._reset_masks.pop(stage, None))
        return obs, infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step all envs and record statistics."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any, stage: int | None = None) -> None:
        """Forward [`PipelinedVectorEnv.step_async`][pipelined_vec_env.PipelinedVectorEnv.step_async]."""
        self.env.step_async(actions, stage=stage)

    def step_wait(
        self, stage: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Forward [`PipelinedVectorEnv.step_wait`][pipelined_vec_env.PipelinedVectorEnv.step_wait] and record the stage's statistics."""
        obs, rewards, terminations, truncations, infos = self.env.step_wait(
            stage=stage, timeout=timeout
        )
        infos = self._record(self._envs(stage), rewards, terminations, truncations, infos)
        return obs, rewards, terminations, truncations, infos

    def wait_any(self, timeout: float | None = None) -> int:
        """Forward [`PipelinedVectorEnv.wait_any`][pipelined_vec_env.PipelinedVectorEnv.wait_any]."""
        return self.env.wait_any(timeout=timeout)
