"""Execute a chunk of actions per ``step``: one worker message per chunk.

VLA policies (ACT, OpenVLA-OFT, pi0) predict an *action chunk*, K future actions, per
inference call and execute them open loop. Stepping the chunk inside the env's process
turns K pipe round trips into one, which is what the reference trainers' ``chunk_step``
does in their env workers.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

__all__ = ["ActionChunk"]


class ActionChunk(gym.Wrapper[Any, np.ndarray, Any, Any]):
    """Run up to ``chunk_size`` actions of the wrapped env in one ``step``.

    The action space becomes ``Box`` of shape ``(chunk_size, *inner_shape)`` with the
    inner bounds repeated. ``step(chunk)`` executes ``chunk[0], chunk[1], ...`` in order
    and stops early at the first step that terminates or truncates (the remaining
    actions are dropped, so an autoresetting vector env resets the env on the next call
    as usual). It returns the observation, ``terminated``, ``truncated`` and ``info`` of
    the last executed step, and as reward the sum of the executed steps' rewards. Two
    keys are added to that ``info``:

    * ``"chunk_rewards"``: float64 ``(chunk_size,)``, the reward of each executed step,
      zero for steps not executed;
    * ``"chunk_steps_executed"``: int in ``[1, chunk_size]``, how many actions ran.

    Infos of the earlier steps of a chunk are not returned (``is_success`` and similar
    flags are sticky at termination, so the last info is the one that matters).

    Args:
        env: Env with a ``Box`` action space.
        chunk_size: K, actions per chunk (>= 1).

    Raises:
        TypeError: If the action space is not a ``Box``.
        ValueError: If ``chunk_size < 1``.

    Examples:
        >>> import gymnasium as gym
        >>> env = ActionChunk(gym.make("Pendulum-v1"), chunk_size=4)
        >>> env.action_space.shape
        (4, 1)
        >>> _ = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        >>> info["chunk_steps_executed"], info["chunk_rewards"].shape
        (4, (4,))
    """

    def __init__(self, env: gym.Env[Any, Any], chunk_size: int) -> None:
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Box):
            raise TypeError(
                f"ActionChunk needs a Box action space, got {type(env.action_space).__name__}."
            )
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
        self.chunk_size = int(chunk_size)
        inner = env.action_space
        self.action_space = gym.spaces.Box(
            low=np.broadcast_to(inner.low, (self.chunk_size, *inner.shape)),
            high=np.broadcast_to(inner.high, (self.chunk_size, *inner.shape)),
            dtype=inner.dtype,
        )

    def step(self, action: np.ndarray) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Execute the chunk until it ends or the episode ends.

        Args:
            action: Array of shape ``(chunk_size, *inner_action_shape)``.

        Returns:
            ``(obs, summed_reward, terminated, truncated, info)`` of the last executed
            step, ``info`` extended with ``chunk_rewards`` and ``chunk_steps_executed``.

        Raises:
            ValueError: If ``action`` does not have the chunk shape.
        """
        chunk = np.asarray(action)
        if chunk.shape != self.action_space.shape:
            raise ValueError(
                f"Expected an action chunk of shape {self.action_space.shape}, got {chunk.shape}."
            )
        rewards = np.zeros(self.chunk_size, dtype=np.float64)
        for i in range(self.chunk_size):
            obs, reward, terminated, truncated, info = self.env.step(chunk[i])
            rewards[i] = float(reward)
            if terminated or truncated:
                break
        info = dict(info)
        info["chunk_rewards"] = rewards
        info["chunk_steps_executed"] = i + 1
        return obs, float(rewards.sum()), terminated, truncated, info
