"""Input checks every expert shares: the goal-feature array and the observation key."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..goal_features import NUM_GOAL_FEATURES

__all__ = ["check_features", "goal_features"]


def check_features(features: Any) -> np.ndarray:
    """``features`` as float64 ``(NUM_GOAL_FEATURES,)`` or ``(B, NUM_GOAL_FEATURES)``.

    Raises:
        ValueError: If it has another shape.
    """
    features = np.asarray(features, dtype=np.float64)
    if features.shape[-1:] != (NUM_GOAL_FEATURES,) or features.ndim not in (1, 2):
        raise ValueError(
            f"features: expected shape ({NUM_GOAL_FEATURES},) or (B, {NUM_GOAL_FEATURES}), "
            f"got {features.shape}"
        )
    return features


def goal_features(obs: dict[str, Any]) -> Any:
    """``obs["goal_features"]``.

    Raises:
        KeyError: If ``obs`` has no ``goal_features`` (build the env with
            ``state_features="goal"`` or ``"both"``).
    """
    if "goal_features" not in obs:
        raise KeyError(
            "obs has no 'goal_features'; build LiberoEnv with state_features='goal' or 'both'"
        )
    return obs["goal_features"]
