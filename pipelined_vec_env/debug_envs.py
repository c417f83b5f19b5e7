"""Small envs whose behaviour is obvious, for tests, examples and benchmarks.

- [`CountingEnv`][pipelined_vec_env.debug_envs.CountingEnv]: the observation holds the env's id and step count, episodes end
  after a per-env length, infos carry keys that appear only on some steps. Equivalence
  with ``SyncVectorEnv`` is easy to read off.
- [`FaultyEnv`][pipelined_vec_env.debug_envs.FaultyEnv]: an env that raises, exits, is killed or sleeps when told to by its
  action, to exercise error handling.
- [`EchoEnv`][pipelined_vec_env.debug_envs.EchoEnv]: an env that echoes its id, its step count and the last action it
  executed, after a random sleep, to prove routing under varying latencies.
- [`ReachEnv`][pipelined_vec_env.debug_envs.ReachEnv]: a point that must reach a goal on a line, with a sparse success
  flag and numbered initial states, for tiny trainer runs (warm starts, evaluations).
- [`BusyEnv`][pipelined_vec_env.debug_envs.BusyEnv]: a CPU-bound env whose step burns a fixed CPU time (calibrated to a
  simulator's step time, e.g. LIBERO's ~10 ms), for pipelining benchmarks.
- [`LatencyEnv`][pipelined_vec_env.debug_envs.LatencyEnv]: an env whose step sleeps a lognormal time (a long tail of slow
  steps, off-CPU), for decoupled-mode tests and benchmarks.
- [`CameraEnv`][pipelined_vec_env.debug_envs.CameraEnv]: camera frames (pre-built RGB images) and a state vector, with
  an optional CPU cost per step, for frame transport tests and benchmarks.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "BusyEnv",
    "CameraEnv",
    "CountingEnv",
    "EchoEnv",
    "FaultyEnv",
    "LatencyEnv",
    "OddConstructorError",
    "ReachEnv",
    "UnpicklableError",
]


def _counting_space(kind: str) -> spaces.Space:
    if kind == "box":
        return spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float64)
    if kind == "dict":
        return spaces.Dict(
            {
                "count": spaces.Box(0, 10_000, shape=(2,), dtype=np.int64),
                "nested": spaces.Tuple(
                    (
                        spaces.Discrete(1_000_000),
                        spaces.Dict(
                            {
                                "bits": spaces.MultiBinary(3),
                                "u8": spaces.Box(0, 255, (2, 2), np.uint8),
                            }
                        ),
                    )
                ),
                "noise": spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32),
            }
        )
    if kind == "text":
        return spaces.Dict(
            {"count": spaces.Box(0, 10_000, shape=(2,), dtype=np.int64), "text": spaces.Text(12)}
        )
    if kind == "sequence":
        return spaces.Sequence(spaces.Box(0, 10_000, shape=(2,), dtype=np.int64), stack=True)
    raise ValueError(f"kind: expected 'box', 'dict', 'text' or 'sequence', got {kind!r}")


class CountingEnv(gym.Env):
    """An env whose observation is its id and step count.

    - reset: step count 0; a noise value drawn from ``np_random`` (so seeds matter);
      info ``{"env_id", "reset_noise"}``.
    - step(a): count += 1; reward ``count + a + env_id / 100``; terminated at
      ``episode_length`` when ``env_id`` is even, truncated otherwise; info ``{"count"}``
      always, ``{"odd": True}`` on odd counts only (exercises gymnasium's info masks).

    Args:
        env_id: An id shown in observations and rewards.
        episode_length: Steps per episode (vary it per env to cross every autoreset path).
        kind: Observation space: ``"box"`` (float64 ``(3,)``: id, count, noise),
            ``"dict"`` (nested Dict/Tuple/Discrete/MultiBinary/uint8 Box), ``"text"``
            (Dict with a Text key) or ``"sequence"`` (no shared memory layout).
        render_mode: ``"rgb_array"`` renders a ``(4, 4, 3)`` uint8 frame filled with the count.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(
        self,
        env_id: int = 0,
        episode_length: int = 5,
        kind: str = "box",
        render_mode: str | None = None,
    ) -> None:
        self.env_id = int(env_id)
        self.episode_length = int(episode_length)
        self.kind = kind
        self.render_mode = render_mode
        self.observation_space = _counting_space(kind)
        self.action_space = spaces.Discrete(3)
        self.count = 0
        self.noise = 0.0

    def _obs(self) -> Any:
        if self.kind == "box":
            return np.array([self.env_id, self.count, self.noise], dtype=np.float64)
        count = np.array([self.env_id, self.count], dtype=np.int64)
        if self.kind == "dict":
            bits = np.array([(self.count >> i) & 1 for i in range(3)], dtype=np.int8)
            u8 = np.full((2, 2), (self.count * 7 + self.env_id) % 256, dtype=np.uint8)
            return {
                "count": count,
                "nested": (self.env_id * 1000 + self.count, {"bits": bits, "u8": u8}),
                "noise": np.array([self.noise], dtype=np.float32),
            }
        if self.kind == "text":
            return {"count": count, "text": f"e{self.env_id}c{self.count}"}
        return tuple(np.array([self.env_id, c], dtype=np.int64) for c in range(self.count % 3 + 1))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.count = int((options or {}).get("start_count", 0))
        self.noise = float(self.np_random.uniform(-1, 1))
        return self._obs(), {"env_id": self.env_id, "reset_noise": self.noise}

    def step(self, action: Any):
        self.count += 1
        reward = self.count + int(action) + self.env_id / 100
        done = self.count >= self.episode_length
        terminated = done and self.env_id % 2 == 0
        truncated = done and self.env_id % 2 == 1
        info: dict[str, Any] = {"count": self.count}
        if self.count % 2:
            info["odd"] = True
        return self._obs(), reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return np.full((4, 4, 3), self.count % 256, dtype=np.uint8)


class OddConstructorError(Exception):
    """An exception whose constructor takes two required arguments (pickle cannot rebuild
    it from ``args`` alone)."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")
        self.code = code
        self.detail = detail


class UnpicklableError(Exception):
    """An exception that holds an unpicklable value."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.handle = lambda: None  # lambdas do not pickle


class FaultyEnv(gym.Env):
    """An env that misbehaves on command.

    Action (``Discrete(7)``): 0 normal step; 1 raise ``ValueError``; 2 ``os._exit(3)``;
    3 ``SIGKILL`` itself; 4 sleep ``sleep_seconds``; 5 raise [`OddConstructorError`][pipelined_vec_env.debug_envs.OddConstructorError];
    6 raise [`UnpicklableError`][pipelined_vec_env.debug_envs.UnpicklableError]. The observation is the step count (float32 ``(1,)``).

    Args:
        sleep_seconds: Duration of action 4, in seconds.
    """

    NORMAL, RAISE, EXIT, SIGKILL, SLEEP, ODD_ERROR, UNPICKLABLE_ERROR = range(7)

    def __init__(self, sleep_seconds: float = 1.0) -> None:
        self.sleep_seconds = sleep_seconds
        self.observation_space = spaces.Box(0, np.inf, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(7)
        self.count = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action: Any):
        action = int(action)
        if action == self.RAISE:
            raise ValueError(f"FaultyEnv was told to raise at step {self.count}")
        if action == self.EXIT:
            os._exit(3)
        if action == self.SIGKILL:
            os.kill(os.getpid(), signal.SIGKILL)
        if action == self.SLEEP:
            time.sleep(self.sleep_seconds)
        if action == self.ODD_ERROR:
            raise OddConstructorError(7, "unusual constructor")
        if action == self.UNPICKLABLE_ERROR:
            raise UnpicklableError("holds a lambda")
        self.count += 1
        return np.array([self.count], dtype=np.float32), 1.0, False, False, {}


class EchoEnv(gym.Env):
    """Observation int64 ``(3,)``: (own id, steps taken, last action executed, -1 after a
    reset); each step first sleeps a random time in ``[0, max_sleep)`` seconds.

    Args:
        env_id: The id shown in observations.
        max_sleep: Upper bound of the per-step sleep, in seconds.
        latency_seed: Seed of the sleep times (default ``env_id``).
    """

    def __init__(
        self, env_id: int, max_sleep: float = 0.004, latency_seed: int | None = None
    ) -> None:
        self.env_id = env_id
        self.max_sleep = max_sleep
        self.observation_space = spaces.Box(-1, 1e12, shape=(3,), dtype=np.int64)
        self.action_space = spaces.Box(0, 1e12, shape=(), dtype=np.int64)
        self.steps = 0
        self.rng = np.random.default_rng(env_id if latency_seed is None else latency_seed)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.steps = 0
        return np.array([self.env_id, 0, -1]), {}

    def step(self, action: Any):
        time.sleep(self.rng.uniform(0, self.max_sleep))
        self.steps += 1
        return np.array([self.env_id, self.steps, int(action)]), 0.0, False, False, {}


class BusyEnv(gym.Env):
    """A CPU-bound env: each step burns ``step_seconds`` of CPU time in the worker.

    Unlike ``time.sleep``, the work occupies a core, so it competes with the policy for
    the CPU exactly like a physics simulator. Observation float32 ``(obs_dim,)``, action
    Box ``(action_dim,)`` in [-1, 1]; reward ``-|a|^2``; episodes truncate after
    ``episode_length`` steps.

    Args:
        step_seconds: CPU time per step, in seconds (LIBERO state-only: ~0.010).
        obs_dim: Observation size.
        action_dim: Action size.
        episode_length: Steps per episode.
    """

    def __init__(
        self,
        step_seconds: float = 0.01,
        obs_dim: int = 16,
        action_dim: int = 7,
        episode_length: int = 200,
    ) -> None:
        self.step_seconds = step_seconds
        self.episode_length = episode_length
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(obs_dim,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(action_dim,), dtype=np.float32)
        self.t = 0
        self.state = np.zeros(obs_dim, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.state = self.np_random.standard_normal(self.state.shape).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action: Any):
        end = time.thread_time() + self.step_seconds
        x = 0.0
        while time.thread_time() < end:
            x += 1.0  # burn CPU time, as a simulator would
        self.t += 1
        action = np.asarray(action, dtype=np.float32)
        self.state = 0.9 * self.state + 0.1 * np.resize(action, self.state.shape)
        reward = -float(np.sum(action**2))
        return self.state.copy(), reward, False, self.t >= self.episode_length, {}


class LatencyEnv(gym.Env):
    """An env whose step sleeps a lognormal time: median ``median_seconds``, shape
    ``sigma`` (the 99th percentile is ``exp(2.326 * sigma)`` times the median: 10x at
    0.99), drawn from a generator seeded with ``latency_seed``. Sleeping keeps the core
    free, as a remote simulator or an accelerator would. Observation float32
    ``(obs_dim,)``, action Box ``(action_dim,)`` in [-1, 1], reward 0; episodes truncate
    after ``episode_length`` steps.

    Args:
        median_seconds: Median step time (seconds).
        sigma: Lognormal shape (0: every step takes the median).
        latency_seed: Seed of the step times.
        obs_dim: Observation size.
        action_dim: Action size.
        episode_length: Steps per episode.
    """

    def __init__(
        self,
        median_seconds: float = 0.005,
        sigma: float = 0.99,
        latency_seed: int = 0,
        obs_dim: int = 8,
        action_dim: int = 2,
        episode_length: int = 1000,
    ) -> None:
        self.median_seconds = median_seconds
        self.sigma = sigma
        self.episode_length = episode_length
        self.rng = np.random.default_rng(latency_seed)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(obs_dim,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(action_dim,), dtype=np.float32)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(self.observation_space.shape, dtype=np.float32), {}

    def step(self, action: Any):
        time.sleep(self.median_seconds * float(np.exp(self.sigma * self.rng.standard_normal())))
        self.t += 1
        obs = np.full(self.observation_space.shape, self.t, dtype=np.float32)
        return obs, 0.0, False, self.t >= self.episode_length, {}


class ReachEnv(gym.Env):
    """Move a point on a line to a goal: continuous actions, sparse success, init states.

    - observation float32 ``(2,)``: position and goal, both in ``[-1, 1]``;
    - action float32 ``(2,)`` in ``[-1, 1]``: the first entry moves the point by
      ``0.2 * a[0]``, the second is ignored (a dimension a policy should keep still);
    - reward ``-|position - goal| / 10`` per step, plus 1 on success; ``terminated`` with
      ``info["is_success"] = True`` once ``|position - goal| < 0.1``, ``truncated``
      after ``horizon`` steps (``is_success`` False on every other step);
    - init states: ``num_init_states`` fixed (position, goal) pairs; a reset uses
      ``options["init_state_id"]``, else ``seed % num_init_states``, else a random one.

    Args:
        horizon: Steps before truncation.
        num_init_states: Number of fixed initial states.
    """

    def __init__(self, horizon: int = 20, num_init_states: int = 10) -> None:
        self.horizon = int(horizon)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        rng = np.random.default_rng(12345)
        self.init_states = rng.uniform(-1.0, 1.0, size=(int(num_init_states), 2))
        self.init_state_id: int | None = None
        self._state = np.zeros(2)
        self._steps = 0

    def _obs(self) -> np.ndarray:
        return self._state.astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        n = len(self.init_states)
        if (options or {}).get("init_state_id") is not None:
            k = int(options["init_state_id"])  # type: ignore[index]
        elif seed is not None:
            k = int(seed) % n
        else:
            k = int(self.np_random.integers(n))
        self.init_state_id = k
        self._state = self.init_states[k].copy()
        self._steps = 0
        return self._obs(), {"init_state_id": k, "is_success": False}

    def step(self, action: Any):
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(2), -1.0, 1.0)
        self._state[0] = np.clip(self._state[0] + 0.2 * a[0], -1.0, 1.0)
        self._steps += 1
        distance = abs(self._state[0] - self._state[1])
        success = bool(distance < 0.1)
        reward = -distance / 10 + float(success)
        truncated = self._steps >= self.horizon and not success
        return self._obs(), reward, success, truncated, {"is_success": success}


class CameraEnv(gym.Env):
    """Camera frames and a state, as a VLA's LIBERO env returns them, at no render cost.

    The frames are built once, at construction (``frames`` random images per camera), and
    a step returns one of them per camera: what is timed is moving frames, not making
    them. Observation (``Dict``): ``"camera0_image"``, ``"camera1_image"`` ... uint8
    ``(side, side, 3)``, then ``"state"`` float32 ``(state_size,)`` whose first entry is
    the step count and second the frame index the step returned. Action Box ``(7,)`` in
    [-1, 1]. Episodes truncate after ``episode_length`` steps.

    Args:
        cameras: Camera images per observation.
        side: Image side in pixels.
        state_size: State entries (at least 2).
        step_seconds: CPU time each step burns, in seconds (a simulator's cost).
        episode_length: Steps per episode.
        frames: Pre-built images per camera; step ``t`` returns image
            ``(t + offset) % frames``, ``offset`` drawn at reset from the env's seed.
    """

    def __init__(
        self,
        cameras: int = 2,
        side: int = 224,
        state_size: int = 9,
        step_seconds: float = 0.0,
        episode_length: int = 1000,
        frames: int = 4,
    ) -> None:
        if cameras < 1 or side < 1 or state_size < 2 or frames < 1:
            raise ValueError(
                f"CameraEnv: expected cameras >= 1, side >= 1, state_size >= 2 and frames >= 1, "
                f"got {cameras}, {side}, {state_size}, {frames}"
            )
        self.step_seconds = step_seconds
        self.episode_length = episode_length
        image = spaces.Box(0, 255, shape=(side, side, 3), dtype=np.uint8)
        self.keys = tuple(f"camera{c}_image" for c in range(cameras))
        self.observation_space = spaces.Dict(
            {
                **{key: image for key in self.keys},
                "state": spaces.Box(-np.inf, np.inf, shape=(state_size,), dtype=np.float32),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(7,), dtype=np.float32)
        rng = np.random.default_rng(0)
        self.frames = [
            rng.integers(0, 256, size=(frames, side, side, 3), dtype=np.uint8) for _ in self.keys
        ]
        self.state = np.zeros(state_size, dtype=np.float32)
        self.t = 0
        self.offset = 0

    def _obs(self) -> dict[str, np.ndarray]:
        index = (self.t + self.offset) % len(self.frames[0])
        self.state[0], self.state[1] = self.t, index
        obs = {key: frames[index] for key, frames in zip(self.keys, self.frames, strict=True)}
        obs["state"] = self.state.copy()
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.offset = int(self.np_random.integers(len(self.frames[0])))
        return self._obs(), {}

    def step(self, action: Any):
        if self.step_seconds > 0:
            end = time.thread_time() + self.step_seconds
            while time.thread_time() < end:
                pass  # burn CPU time, as a simulator would
        self.t += 1
        return self._obs(), 0.0, False, self.t >= self.episode_length, {}
