"""A scripted expert that turns a stove's knob on, over LIBERO's privileged state.

LIBERO's ``flat_stove`` counts as on once its knob's hinge (``flat_stove_1_button``,
about world +z) reaches 0.5 rad (``default_turnon_ranges`` of
``libero.libero.envs.objects.articulated_objects.FlatStove``; it starts at 0). The
knob's angle is not observed, but its axis is: the goal ``(Turnon flat_stove_1)`` is
unary, so the goal features' ``object_pos`` is the stove body's origin, and the hinge
sits there (measured in libero_goal's "turn on the stove" model: offset 0 between the
``flat_stove_1_button`` and ``flat_stove_1_main`` bodies; the stove is placed without
yaw). The knob's handle is a bar along world x through the axis, ~9 cm long, 2.5 cm wide
(y), its top (``object_top``) 5 cm above the origin; pushing its +x end towards +y turns
the knob counterclockwise seen from above, i.e. on.

The gripper stays open, its fingers straddling the handle, and the -y finger (its pad
``finger_offset`` from the end-effector) pushes the handle's -y face: a closed hand
pushing there catches the handle's top edge with its fingers' upper part, and the arm
(elbow at its joint limit) cannot bring the hand any nearer the robot's base than this.
Like `PickPlaceExpert` the expert is a pure function of the current features (no phase
memory); with the finger's position in polar coordinates around the knob's axis:

1. *pushing* (the finger at the push height, near the circle of ``radius``, between
   the start and the end angle): move the finger along the circle, counterclockwise;
2. above the start point (behind the handle, on its -y side): descend to the push height;
3. elsewhere: move the finger to above the start point, clear of the handle's top.

Past the end angle the hand rises and starts over; the episode ends once the knob is on,
so no phase needs to know it. Motion is a proportional controller on the end-effector
position (OSC_POSE deltas, clipped to [-1, 1]); rotation stays 0. Measured success is in
docs/libero.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..goal_features import GOAL_FEATURE_SLICES
from ._inputs import check_features, goal_features

__all__ = ["KnobExpert"]

_S = GOAL_FEATURE_SLICES


@dataclass(frozen=True)
class KnobExpert:
    """Proportional knob-turning controller; a pure function of the goal features.

    Distances are metres, angles radians (counterclockwise from world +x, seen from
    above, around the knob's axis at ``object_pos``), ``gain`` is action units per metre
    of position error (an OSC_POSE action of 1 asks for 5 cm of motion).

    Attributes:
        gain: Position gain.
        radius: Distance from the axis at which the finger pushes the handle.
        start_angle: Angle of the start point, behind the handle (which lies at 0).
        end_angle: Angle past which the hand stops pushing and starts over.
        lead: How far ahead (angle) along the circle the pushing finger aims.
        push_depth: The end-effector pushes this far below the handle's top
            (``object_top``).
        hover: Approach this far above the handle's top.
        xy_tolerance: Horizontal error under which the finger descends onto the start.
        z_tolerance: Height error around the push height that counts as pushing.
        radial_tolerance: Radial error from ``radius`` that counts as pushing (the
            angle may lag ``start_angle`` by up to ``lead / 2``).
        finger_offset: The pushing finger's pad is this far along -y from the
            end-effector (half the open gripper's width); the circle is the pad's.

    Examples:
        >>> import numpy as np
        >>> from pipelined_vec_env.libero.goal_features import NUM_GOAL_FEATURES
        >>> KnobExpert()(np.zeros((4, NUM_GOAL_FEATURES))).shape
        (4, 7)
    """

    gain: float = 10.0
    radius: float = 0.034
    start_angle: float = -0.8
    end_angle: float = 1.5
    lead: float = 1.0
    push_depth: float = 0.016
    hover: float = 0.04
    xy_tolerance: float = 0.015
    z_tolerance: float = 0.015
    radial_tolerance: float = 0.03
    finger_offset: float = 0.045

    def __call__(self, features: np.ndarray, state: np.ndarray | None = None) -> np.ndarray:
        """Expert actions for goal features.

        Args:
            features: float ``(NUM_GOAL_FEATURES,)`` or ``(B, NUM_GOAL_FEATURES)``.
            state: Ignored (accepted so that `act` matches `PickPlaceExpert`'s).

        Returns:
            float32 actions ``(7,)`` or ``(B, 7)`` in ``[-1, 1]``: xyz, rotation (0) and
            gripper (-1: open throughout).

        Raises:
            ValueError: If the last dimension is not ``NUM_GOAL_FEATURES``.
        """
        features = check_features(features)
        if features.ndim == 1:
            return self._act(features)
        if not len(features):
            return np.zeros((0, 7), dtype=np.float32)
        return np.stack([self._act(f) for f in features])

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Expert actions for a (batched) LIBERO observation dict with ``goal_features``.

        Raises:
            KeyError: If ``obs`` has no ``goal_features`` (build the env with
                ``state_features="goal"`` or ``"both"``).
        """
        return self(goal_features(obs))

    @staticmethod
    def _polar(axis: np.ndarray, radius: float, angle: float, z: float) -> np.ndarray:
        """The point at ``radius`` and ``angle`` around ``axis``, at height ``z``."""
        return np.array([axis[0] + radius * np.cos(angle), axis[1] + radius * np.sin(angle), z])

    def _act(self, f: np.ndarray) -> np.ndarray:
        eef, axis = f[_S["eef_pos"]], f[_S["object_pos"]]
        finger = eef - np.array([0.0, self.finger_offset, 0.0])
        top = float(f[_S["object_top"]][0])
        push_z = top - self.push_depth
        rel = finger[:2] - axis[:2]
        angle = float(np.arctan2(rel[1], rel[0]))
        pushing = (
            abs(finger[2] - push_z) < self.z_tolerance
            and abs(float(np.linalg.norm(rel)) - self.radius) < self.radial_tolerance
            and self.start_angle - self.lead / 2 < angle < self.end_angle
        )
        start = self._polar(axis, self.radius, self.start_angle, push_z)
        if pushing:
            ahead = max(angle, self.start_angle) + self.lead
            goal = self._polar(axis, self.radius, ahead, push_z)
        elif np.linalg.norm(start[:2] - finger[:2]) > self.xy_tolerance:
            goal = np.array([start[0], start[1], top + self.hover])
        else:
            goal = start - np.array([0.0, 0.0, 0.01])
        action = np.zeros(7, dtype=np.float32)
        action[:3] = np.clip(self.gain * (goal - finger), -1.0, 1.0)
        action[6] = -1.0  # open
        return action
