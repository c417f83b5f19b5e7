"""A vector env's spaces and metadata, from the descriptions its workers send when ready.

Each worker describes its envs (observation and action spaces, metadata, render mode,
spec); `spaces_from_descriptions` checks they agree as `observation_mode` requires and
batches them as gymnasium's `SyncVectorEnv` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gymnasium import Space
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_differing_spaces, batch_space

__all__ = ["EnvSpaces", "spaces_from_descriptions"]


@dataclass(frozen=True)
class EnvSpaces:
    """The spaces and metadata of a vector env.

    Attributes:
        single_observation_space: One env's observation space.
        observation_space: The batched observation space over `num_envs` envs.
        single_action_space: One env's action space.
        action_space: The batched action space.
        metadata: Env 0's metadata with `"autoreset_mode"` set.
        render_mode: Env 0's render mode.
        env_spec: Env 0's spec.
    """

    single_observation_space: Space
    observation_space: Space
    single_action_space: Space
    action_space: Space
    metadata: dict[str, Any]
    render_mode: Any
    env_spec: Any


def spaces_from_descriptions(
    descriptions: list[dict[str, Any]],
    num_envs: int,
    observation_mode: str | tuple[Space, Space],
    autoreset_mode: AutoresetMode,
) -> EnvSpaces:
    """Batch the spaces the workers described and check that the envs agree.

    Args:
        descriptions: One per worker, in worker order, each with `"observation_spaces"`
            and `"action_spaces"` (one per env of the worker), `"metadata"`,
            `"render_mode"` and `"spec"`.
        num_envs: Envs in all.
        observation_mode: `"same"`, `"different"` or `(batched_space, single_space)`.
        autoreset_mode: Written into the metadata.

    Returns:
        The vector env's spaces and metadata.

    Raises:
        RuntimeError: Under `"same"` an env's observation space differs from env 0's;
            otherwise one does not share shape and dtype with it; or an env's action space
            differs from env 0's (each naming the env).
    """
    obs_spaces = [s for d in descriptions for s in d["observation_spaces"]]
    act_spaces = [s for d in descriptions for s in d["action_spaces"]]
    first = descriptions[0]
    metadata = dict(first["metadata"])
    metadata["autoreset_mode"] = autoreset_mode
    single_action = act_spaces[0]
    mode = observation_mode
    if isinstance(mode, tuple):
        batched_obs, single_obs = mode
    elif mode == "same":
        single_obs = obs_spaces[0]
        batched_obs = batch_space(single_obs, num_envs)
    else:
        single_obs = obs_spaces[0]
        batched_obs = batch_differing_spaces(obs_spaces)
    for i, (obs_space, act_space) in enumerate(zip(obs_spaces, act_spaces, strict=False)):
        if mode == "same" and obs_space != single_obs:
            raise RuntimeError(
                f"observation_mode='same' but env {i}'s observation space {obs_space} "
                f"differs from env 0's {single_obs}; use "
                "observation_mode='different' if this is intended"
            )
        if mode != "same" and not is_space_dtype_shape_equiv(obs_space, single_obs):
            raise RuntimeError(
                f"env {i}'s observation space {obs_space} does not share shape and dtype "
                f"with {single_obs}"
            )
        if act_space != single_action:
            raise RuntimeError(
                f"env {i}'s action space {act_space} differs from env 0's {single_action}"
            )
    return EnvSpaces(
        single_observation_space=single_obs,
        observation_space=batched_obs,
        single_action_space=single_action,
        action_space=batch_space(single_action, num_envs),
        metadata=metadata,
        render_mode=first["render_mode"],
        env_spec=first["spec"],
    )
