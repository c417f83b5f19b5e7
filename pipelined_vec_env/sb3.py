"""Stable-Baselines3 adapter: a [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] behind SB3's ``VecEnv`` API.

SB3 is an optional extra (``pip install pipelined-vec-env[sb3]``); this is the only module
that imports it.

Examples:
    >>> import gymnasium as gym
    >>> from stable_baselines3 import PPO
    >>> from pipelined_vec_env.sb3 import SB3VecEnv
    >>> venv = SB3VecEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    >>> model = PPO("MlpPolicy", venv, n_steps=16, batch_size=32, n_epochs=1)
    >>> _ = model.learn(total_timesteps=32)
    >>> venv.close()
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from .by_value import ByValue
from .infos import split_infos
from .vector_env import PipelinedVectorEnv

__all__ = ["SB3VecEnv", "split_infos"]

logger = logging.getLogger(__name__)


def _wrapper_check(wrapper_class: type) -> ByValue:
    """A function ``env -> bool``: whether some wrapper layer of ``env`` is an instance of
    ``wrapper_class`` (subclasses count, as in SB3's ``is_wrapped``).

    Classes are compared by module and qualified name, so the worker need not import the
    wrapper's module (SB3's ``Monitor`` would import torch there).
    """
    target = (wrapper_class.__module__, wrapper_class.__qualname__)

    def has_layer(env: gym.Env) -> bool:
        while isinstance(env, gym.Wrapper):
            if any((c.__module__, c.__qualname__) == target for c in type(env).__mro__):
                return True
            env = env.env
        return False

    return ByValue(has_layer)


def _batched_actions(space: gym.Space, actions: Any, num_envs: int) -> Any:
    """SB3's per-env action list for a Dict or Tuple action space (what `SubprocVecEnv`
    and `DummyVecEnv` index by env) as gymnasium's batched layout, values and dtypes kept;
    anything else unchanged (arrays already are gymnasium's layout)."""
    if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return actions
    if not isinstance(actions, (list, tuple)) or len(actions) != num_envs:
        return actions
    if isinstance(space, gym.spaces.Tuple) and not all(
        isinstance(a, (list, tuple)) and len(a) == len(space.spaces) for a in actions
    ):
        return actions  # a tuple of batches: gymnasium's layout already
    if isinstance(space, gym.spaces.Dict) and not all(isinstance(a, dict) for a in actions):
        return actions
    return _stack(space, list(actions))


def _stack(space: gym.Space, items: list[Any]) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: _stack(sub, [item[k] for item in items]) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_stack(sub, [item[j] for item in items]) for j, sub in enumerate(space.spaces))
    if isinstance(
        space,
        (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary),
    ):
        return np.stack([np.asarray(item) for item in items])
    return tuple(items)


class SB3VecEnv(VecEnv):
    """A [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv] with Stable-Baselines3's ``VecEnv`` API.

    Behaves like SB3's ``SubprocVecEnv``: envs autoreset in the step that ends their
    episode; the info of that step holds ``"terminal_observation"``; every step's info
    holds ``"TimeLimit.truncated"`` (truncated and not terminated); ``reset_infos[i]`` is
    env ``i``'s info from its latest reset; seeds set with `seed` and options set
    with `set_options` apply to the next `reset` only.

    Observations come in gymnasium's batched layout, which for SB3's spaces (Box,
    Discrete, MultiDiscrete, MultiBinary, and Dict/Tuple of those) is the same as SB3's:
    one array per key or item with the env as first axis. Rewards are float64 and dones
    bool, both of shape ``(num_envs,)``. Infos are each env's own dict as the env wrote
    it (the adapter sets the env's `info_layout` to `"per_env"`: nothing is batched).
    `indices` may be negative, as in SB3's VecEnvs.

    Args:
        envs: Either env constructors (cloudpickled into the workers, lambdas work), from
            which a ``PipelinedVectorEnv`` with ``SAME_STEP`` autoreset is built with
            ``pipelined_kwargs``; or an existing ``PipelinedVectorEnv`` that uses
            ``AutoresetMode.SAME_STEP``. The adapter owns it: `close` closes it, and
            its `info_layout` becomes `"per_env"`.
        **pipelined_kwargs: Keyword arguments of ``PipelinedVectorEnv`` (``num_stages``,
            ``envs_per_worker`` (default: about one worker per usable core in each stage),
            ``context``, ``cpu_affinity``, ...), only with env
            constructors.

    Attributes:
        pipelined: The underlying ``PipelinedVectorEnv``.

    Raises:
        ValueError: An existing env whose autoreset mode is not ``SAME_STEP``; an
            ``autoreset_mode`` other than ``SAME_STEP`` in ``pipelined_kwargs``; keyword
            arguments given with an existing env.
        TypeError: ``envs`` is neither a sequence of callables nor a ``PipelinedVectorEnv``.
    """

    def __init__(
        self,
        envs: Sequence[Callable[[], gym.Env]] | PipelinedVectorEnv,
        **pipelined_kwargs: Any,
    ) -> None:
        if isinstance(envs, PipelinedVectorEnv):
            if pipelined_kwargs:
                raise ValueError(
                    "keyword arguments are for building a PipelinedVectorEnv from env fns; "
                    f"got {sorted(pipelined_kwargs)} with an existing PipelinedVectorEnv"
                )
            if envs.autoreset_mode != AutoresetMode.SAME_STEP:
                raise ValueError(
                    "SB3VecEnv needs a PipelinedVectorEnv with SAME_STEP autoreset (SB3 resets "
                    "an env in the step that ends its episode), got autoreset_mode="
                    f"{envs.autoreset_mode}; build it with "
                    "autoreset_mode=AutoresetMode.SAME_STEP or pass the env fns instead"
                )
            pipelined = envs
        elif isinstance(envs, (list, tuple)) and all(callable(fn) for fn in envs):
            mode = pipelined_kwargs.pop("autoreset_mode", AutoresetMode.SAME_STEP)
            if AutoresetMode(mode) != AutoresetMode.SAME_STEP:
                raise ValueError(
                    "SB3VecEnv needs SAME_STEP autoreset (SB3 resets an env in the step that "
                    f"ends its episode), got autoreset_mode={mode!r}"
                )
            pipelined_kwargs.pop("info_layout", None)  # the adapter needs the envs' own dicts
            pipelined = PipelinedVectorEnv(
                envs,
                autoreset_mode=AutoresetMode.SAME_STEP,
                info_layout="per_env",
                **pipelined_kwargs,
            )
        else:
            raise TypeError(
                "envs: expected a list of env constructors or a PipelinedVectorEnv, got "
                f"{type(envs).__name__}"
            )
        # SB3 hands each env's info dict on as the env wrote it: no batching round trip
        pipelined.info_layout = "per_env"
        self.pipelined = pipelined
        self.waiting = False
        self.closed = False
        try:
            super().__init__(
                pipelined.num_envs,
                pipelined.single_observation_space,
                pipelined.single_action_space,
            )
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ reset / step

    def reset(self) -> VecEnvObs:
        """Reset every env with the seeds and options set since the last reset.

        Returns:
            The first observations, batched over ``num_envs``. ``reset_infos`` holds the
            reset infos.
        """
        if self.waiting:  # SB3: a reset cancels the step in flight
            self.pipelined.step_wait()
            self.waiting = False
        options = [o or None for o in self._options]
        obs, infos = self.pipelined.reset(seed=list(self._seeds), options=options)
        self.reset_infos = list(infos)
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Send one action per env to the workers and return at once.

        Args:
            actions: A batch of ``num_envs`` actions (numpy array or torch tensor) of
                shape ``(num_envs, *action_space.shape)``; for Dict and Tuple action
                spaces also SB3's list of one action per env (stacked here, values and
                dtypes kept) or gymnasium's batched layout (a dict / tuple of batches).

        Raises:
            ValueError: Wrong shape or out-of-space discrete actions (no env moves).
            TypeError: A scalar instead of a batch.
        """
        self.pipelined.step_async(_batched_actions(self.action_space, actions, self.num_envs))
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step sent by `step_async`.

        Returns:
            ``(observations, rewards, dones, infos)``: observations after autoreset;
            rewards float64 and dones bool of shape ``(num_envs,)``; one info dict per
            env, with ``"terminal_observation"`` for envs whose episode ended and
            ``"TimeLimit.truncated"`` always.
        """
        obs, rewards, terminations, truncations, infos = self.pipelined.step_wait()
        self.waiting = False
        dones = terminations | truncations
        env_infos: list[dict[str, Any]] = []
        for i, info in enumerate(infos):
            if dones[i]:
                step_info = info.pop("final_info", {})
                step_info["terminal_observation"] = info.pop("final_obs")
                self.reset_infos[i] = info
                info = step_info
            info["TimeLimit.truncated"] = bool(truncations[i] and not terminations[i])
            env_infos.append(info)
        return obs, rewards, dones, env_infos

    def close(self) -> None:
        """Close the underlying ``PipelinedVectorEnv`` (idempotent; always returns)."""
        if self.closed:
            return
        self.closed = True
        self.pipelined.close()

    # ------------------------------------------------------------------ env access

    def _indices(self, indices: VecEnvIndices) -> list[int]:
        """The selected envs as indices in `[0, num_envs)`; negative ones count from the
        end, as Python lists (and so SB3's own VecEnvs) index.

        Raises:
            IndexError: An index outside `[-num_envs, num_envs)` (as SB3's VecEnvs).
        """
        n = self.num_envs
        out = []
        for i in self._get_indices(indices):
            if not -n <= int(i) < n:
                raise IndexError(f"indices: {i} is out of range for {n} envs")
            out.append(int(i) % n)
        return out

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return attribute ``attr_name`` of the selected envs (looked up through wrappers).

        Methods are returned as they are, not called (unlike gymnasium's ``get_attr``).

        Raises:
            AttributeError: An env has no such attribute.
        """
        return list(self.pipelined.call_at(self._indices(indices), "get_wrapper_attr", attr_name))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set attribute ``attr_name`` to ``value`` on each selected env.

        The attribute is set with gymnasium's ``set_wrapper_attr`` (on the wrapper layer
        that has it, else on the outermost one). ``value`` is the same object for every
        env, even if it is a list.
        """
        targets = self._indices(indices)
        self.pipelined.set_attr_at(targets, attr_name, [value] * len(targets))

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Call method ``method_name`` of each selected env and return the results."""
        return list(
            self.pipelined.call_at(
                self._indices(indices), method_name, *method_args, **method_kwargs
            )
        )

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Whether each selected env has a ``wrapper_class`` layer (subclasses count)."""
        return list(self.pipelined.call_at(self._indices(indices), _wrapper_check(wrapper_class)))

    def get_images(self) -> Sequence[np.ndarray | None]:
        """One RGB frame per env (needs ``render_mode="rgb_array"``; else Nones, warned)."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"get_images() needs render_mode 'rgb_array', the envs have {self.render_mode!r}",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return list(self.pipelined.render())

    def __repr__(self) -> str:
        return f"SB3VecEnv({self.pipelined!r})"
