"""A scripted pick-and-place expert over LIBERO's privileged state.

The expert is a pure function of the current goal-relative features
(`pipelined_vec_env.libero.goal_features`): it keeps no phase memory, so it can label any
state, including states it never visited itself, which is what DART-style noise injection
and DAgger need (Laskey et al. 2017, "DART: Noise Injection for Robust Imitation
Learning"; Ross et al. 2011, "A Reduction of Imitation Learning to No-Regret Online
Learning"). Which phase applies is read from the state:

1. *not holding*, hand not above the object: move above the grasp point, gripper open;
2. above it: descend to the grasp point, gripper open;
3. at the grasp point: close;
4. *closing* (fingers still moving, object between them): stay, keep closing;
5. *holding* (fingers stopped, object in the hand): lift straight up to the carry height,
   then carry above the target;
6. above the target: lower to the release height, then open.

"Holding" is read from the finger opening and velocity and the object's offset from the
hand. The grasp point is on the object's vertical axis, at its origin or, for tall
objects, ``grasp_depth`` below its top, so the palm clears the object's top. Motion is a
proportional controller on the end-effector position (OSC_POSE deltas, clipped to
[-1, 1]); rotation stays 0, so the gripper keeps its initial top-down orientation.

It solves the pick-and-place tasks of LIBERO whose goal is ``in``/``on`` a target
(libero_object, most of libero_spatial); see docs/libero.md for measured success rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .goal_features import GOAL_FEATURE_SLICES, NUM_GOAL_FEATURES

__all__ = ["PickPlaceExpert"]

_S = GOAL_FEATURE_SLICES


@dataclass(frozen=True)
class PickPlaceExpert:
    """Proportional pick-and-place controller; a pure function of the goal features.

    Distances are metres, ``gain`` is action units per metre of position error (an
    OSC_POSE action of 1 asks for 5 cm of motion).

    Attributes:
        gain: Position gain.
        hover: Height of the approach point above the object's top.
        grasp_depth: Grasp this far below the top of tall objects.
        xy_tolerance: Horizontal error under which the hand descends onto the object.
        grasp_tolerance: Height above the grasp point at which the gripper closes.
        carry_height: Carry the object's origin this high above the target.
        release_height: Open the gripper once the object's origin is this high above
            the target (and above it horizontally).
        place_tolerance: Horizontal object-to-target error under which it is lowered.
        open_width: Finger opening of the open gripper (m).
        finger_speed: Finger speed (m/s) under which the fingers count as stopped.

    Example:
        >>> import numpy as np
        >>> from pipelined_vec_env.libero.goal_features import NUM_GOAL_FEATURES
        >>> PickPlaceExpert()(np.zeros((4, NUM_GOAL_FEATURES))).shape
        (4, 7)
    """

    gain: float = 10.0
    hover: float = 0.06
    grasp_depth: float = 0.04
    xy_tolerance: float = 0.01
    grasp_tolerance: float = 0.012
    carry_height: float = 0.15
    release_height: float = 0.08
    place_tolerance: float = 0.015
    open_width: float = 0.075
    finger_speed: float = 0.01

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """Expert actions for goal features.

        Args:
            features: float ``(NUM_GOAL_FEATURES,)`` or ``(B, NUM_GOAL_FEATURES)``.

        Returns:
            float32 actions ``(7,)`` or ``(B, 7)`` in ``[-1, 1]``: xyz, rotation (0) and
            gripper (-1 open, +1 close).

        Raises:
            ValueError: If the last dimension is not ``NUM_GOAL_FEATURES``.
        """
        features = np.asarray(features, dtype=np.float64)
        if features.shape[-1:] != (NUM_GOAL_FEATURES,) or features.ndim not in (1, 2):
            raise ValueError(
                f"features: expected shape ({NUM_GOAL_FEATURES},) or (B, {NUM_GOAL_FEATURES}), "
                f"got {features.shape}"
            )
        if features.ndim == 1:
            return self._act(features)
        return np.stack([self._act(row) for row in features]) if len(features) else np.zeros(
            (0, 7), dtype=np.float32
        )

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Expert actions for a (batched) LIBERO observation dict with ``goal_features``.

        Raises:
            KeyError: If ``obs`` has no ``goal_features`` (build the env with
                ``state_features="goal"`` or ``"both"``).
        """
        if "goal_features" not in obs:
            raise KeyError(
                "obs has no 'goal_features'; build LiberoEnv with state_features='goal' or 'both'"
            )
        return self(obs["goal_features"])

    def _act(self, f: np.ndarray) -> np.ndarray:
        eef, obj, target = f[_S["eef_pos"]], f[_S["object_pos"]], f[_S["target_pos"]]
        qpos, qvel = f[_S["gripper_qpos"]], f[_S["gripper_qvel"]]
        top = float(f[_S["object_top"]][0])
        width = qpos[0] - qpos[1]
        grasp = np.array([obj[0], obj[1], max(obj[2], top - self.grasp_depth)])
        to_grasp = grasp - eef
        in_hand = np.linalg.norm(to_grasp[:2]) < 0.02 and abs(to_grasp[2]) < 0.03
        closed = width < self.open_width - 0.004
        fingers_moving = float(np.abs(qvel).max()) > self.finger_speed

        grip = -1.0
        if in_hand and closed and not fingers_moving:  # holding
            grip = 1.0
            to_target = target[:2] - obj[:2]
            distance = float(np.linalg.norm(to_target))
            carry_z = target[2] + self.carry_height
            lowering = distance < 2 * self.place_tolerance and obj[2] < carry_z - 0.04
            if distance < self.place_tolerance or lowering:
                if obj[2] <= target[2] + self.release_height:
                    grip, goal = -1.0, eef
                else:
                    drop = target[2] + self.release_height - 0.02 - obj[2]
                    goal = eef + np.array([to_target[0], to_target[1], drop])
            elif obj[2] < carry_z - 0.04:  # lift straight up first
                goal = eef + np.array([0.0, 0.0, carry_z - obj[2]])
            else:
                goal = eef + np.array([to_target[0], to_target[1], carry_z - obj[2]])
        elif in_hand and closed:  # closing on the object
            grip, goal = 1.0, eef
        elif np.linalg.norm(to_grasp[:2]) > self.xy_tolerance:
            approach_z = max(grasp[2] + 0.1, top + self.hover)
            goal = np.array([grasp[0], grasp[1], approach_z])
        else:
            goal = grasp - np.array([0.0, 0.0, 0.01])
            if eef[2] <= grasp[2] + self.grasp_tolerance:
                grip = 1.0
        action = np.zeros(7, dtype=np.float32)
        action[:3] = np.clip(self.gain * (goal - eef), -1.0, 1.0)
        action[6] = grip
        return action
