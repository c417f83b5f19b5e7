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
objects, ``grasp_depth`` below its top, so the palm clears the object's top. When the
full ``state`` is observed too, the grasp point is shifted along x (across the hand's
width, the Panda hand being ~20 cm long along its finger axis, world y) away from a
neighbouring object that the hand would land on: the one failure mode seen. Motion is a
proportional controller on the end-effector position (OSC_POSE deltas, clipped to
[-1, 1]); rotation stays 0, so the gripper keeps its initial top-down orientation.

A bowl or a plate is wider than the open gripper: ``rim_offset`` moves the grasp point
onto its rim wall. Three behaviours are opt-in (their defaults leave the actions as
without them), each read from ``state``: ``grasp_yaw`` turns the hand about z
(proportional control of the yaw read from its quaternion; it descends only once turned)
and the rim grasp point with it; ``tilt_grasp`` puts the grasp point on a tilted bowl's
rim, from its orientation (`_orientation.rim_point`); ``place_gain`` raises the gain while
lowering the object onto the target. `pipelined_vec_env.libero.experts.expert_for` holds
each task's settings; per-task success rates are in docs/libero.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..goal_features import GOAL_FEATURE_SLICES
from ._inputs import check_features, goal_features
from ._orientation import EEF_QUAT, hand_yaw, object_quat, rim_point, wrap_angle

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
        hand_half_length: Half the hand's extent along the finger axis (world y) plus a
            neighbour's radius: neighbours closer than this in y can be hit.
        hand_half_width: The same across the hand (world x).
        max_shift: Largest shift of the grasp point away from a neighbour.
        rim_offset: Grasp this far along y from the object's axis (0: on the axis). A
            bowl wider than the open gripper is grasped by its rim: its radius, ~0.047.
        place_gain: Position gain while lowering the held object onto the target (None:
            ``gain``); a higher gain keeps the arm from stalling short of it.
        grasp_yaw: Turn the hand to this yaw (rad, about world z; 0 is the initial
            top-down orientation, fingers closing along y) and keep it there; the rim
            grasp point turns with it (``rim_offset`` along the rotated y). Needs
            ``state`` (the hand's quaternion); None: no rotation (action 0).
        yaw_gain: Rotation action per radian of yaw error (an action of 1 turns ~0.5 rad).
        yaw_tolerance: Yaw error (rad) under which the hand descends onto the object.
        tilt_grasp: Grasp a tilted bowl's rim where it is: the grasp point is the rim's
            point on the ``rim_offset`` side, from the object's orientation in ``state``
            (`rim_point`), ``grasp_depth`` below it. False: ``rim_offset`` from the axis,
            ``grasp_depth`` below the object's top.

    Examples:
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
    hand_half_length: float = 0.12
    hand_half_width: float = 0.07
    max_shift: float = 0.025
    rim_offset: float = 0.0
    place_gain: float | None = None
    grasp_yaw: float | None = None
    yaw_gain: float = 2.0
    yaw_tolerance: float = 0.05
    tilt_grasp: bool = False

    def __call__(self, features: np.ndarray, state: np.ndarray | None = None) -> np.ndarray:
        """Expert actions for goal features (and, optionally, the full state).

        Args:
            features: float ``(NUM_GOAL_FEATURES,)`` or ``(B, NUM_GOAL_FEATURES)``.
            state: The matching LIBERO ``state`` vectors ``(D,)`` or ``(B, D)`` (39
                proprio values, then 14 per object, zero padding), used to keep the hand
                clear of neighbouring objects; None: no clearance shift.

        Returns:
            float32 actions ``(7,)`` or ``(B, 7)`` in ``[-1, 1]``: xyz, rotation (0) and
            gripper (-1 open, +1 close).

        Raises:
            ValueError: If the last dimension is not ``NUM_GOAL_FEATURES``.
        """
        features = check_features(features)
        if state is not None:
            state = np.asarray(state, dtype=np.float64)
            if state.shape[:-1] != features.shape[:-1]:
                raise ValueError(
                    f"state: expected one state per feature row, got shapes {state.shape} "
                    f"and {features.shape}"
                )
        if features.ndim == 1:
            return self._act(features, state)
        if not len(features):
            return np.zeros((0, 7), dtype=np.float32)
        rows = state if state is not None else [None] * len(features)
        return np.stack([self._act(f, s) for f, s in zip(features, rows, strict=True)])

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Expert actions for a (batched) LIBERO observation dict with ``goal_features``.

        Raises:
            KeyError: If ``obs`` has no ``goal_features`` (build the env with
                ``state_features="goal"`` or ``"both"``).
        """
        return self(goal_features(obs), obs.get("state"))

    def _neighbours(self, state: np.ndarray, obj: np.ndarray, target: np.ndarray) -> np.ndarray:
        """Positions ``(n, 3)`` of the scene's other objects (not the goal's object or target)."""
        blocks = state[39:]
        blocks = blocks[: len(blocks) // 14 * 14].reshape(-1, 14)
        blocks = blocks[np.abs(blocks[:, 3:7]).sum(1) > 0]  # zero padding has no quaternion
        pos = blocks[:, :3]
        keep = (np.linalg.norm(pos - obj, axis=1) > 1e-3) & (
            np.linalg.norm(pos[:, :2] - target[:2], axis=1) > 0.05
        )
        return pos[keep]

    def _clearance_shift(
        self, grasp: np.ndarray, state: np.ndarray | None, obj: np.ndarray, target: np.ndarray
    ) -> float:
        """Shift along x that keeps the hand off neighbours standing above the grasp height.

        None with ``grasp_yaw``: the hand's extents are those of the unturned hand.
        """
        if state is None or self.grasp_yaw is not None:
            return 0.0
        shift = 0.0
        for pos in self._neighbours(state, obj, target):
            dx, dy = pos[0] - grasp[0], pos[1] - grasp[1]
            taller = pos[2] > grasp[2] + 0.01
            if taller and abs(dy) < self.hand_half_length and abs(dx) < self.hand_half_width:
                need = self.hand_half_width - abs(dx)
                shift = -np.sign(dx) * min(need, self.max_shift) if dx else self.max_shift
        return float(shift)

    def _closing_direction(self) -> np.ndarray:
        """Horizontal unit vector ``(2,)`` the fingers close along: y turned by ``grasp_yaw``."""
        yaw = self.grasp_yaw or 0.0
        return np.array([-np.sin(yaw), np.cos(yaw)])

    def _grasp_point(self, obj: np.ndarray, top: float, state: np.ndarray | None) -> np.ndarray:
        """Where the hand closes: on the axis or its rim, ``grasp_depth`` below the top (m)."""
        if self.grasp_yaw is None and not self.tilt_grasp:
            return np.array([obj[0], obj[1] + self.rim_offset, max(obj[2], top - self.grasp_depth)])
        across = self._closing_direction() * self.rim_offset
        quat = object_quat(state, obj) if self.tilt_grasp and state is not None else None
        if quat is None or not self.rim_offset:
            return np.array(
                [obj[0] + across[0], obj[1] + across[1], max(obj[2], top - self.grasp_depth)]
            )
        rim = rim_point(obj, top, quat, across, abs(self.rim_offset))
        return np.array([rim[0], rim[1], max(obj[2], rim[2] - self.grasp_depth)])

    def _yaw_error(self, state: np.ndarray | None) -> float | None:
        """``grasp_yaw`` minus the hand's yaw (rad, wrapped), None without yaw control."""
        if self.grasp_yaw is None or state is None:
            return None
        return wrap_angle(self.grasp_yaw - hand_yaw(state[EEF_QUAT]))

    def _act(self, f: np.ndarray, state: np.ndarray | None) -> np.ndarray:
        eef, obj, target = f[_S["eef_pos"]], f[_S["object_pos"]], f[_S["target_pos"]]
        qpos, qvel = f[_S["gripper_qpos"]], f[_S["gripper_qvel"]]
        top = float(f[_S["object_top"]][0])
        width = qpos[0] - qpos[1]
        grasp = self._grasp_point(obj, top, state)
        to_axis = grasp - eef
        # a shifted grasp holds the object off-centre: allow for the shift
        in_hand = np.linalg.norm(to_axis[:2]) < 0.02 + self.max_shift and abs(to_axis[2]) < 0.03
        grasp[0] += self._clearance_shift(grasp, state, obj, target)
        to_grasp = grasp - eef
        closed = width < self.open_width - 0.004
        fingers_moving = float(np.abs(qvel).max()) > self.finger_speed

        yaw_error = self._yaw_error(state)
        aligned = yaw_error is None or abs(yaw_error) < self.yaw_tolerance
        grip, gain = -1.0, self.gain
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
                    if self.place_gain is not None:
                        gain = self.place_gain
                    drop = target[2] + self.release_height - 0.02 - obj[2]
                    goal = eef + np.array([to_target[0], to_target[1], drop])
            elif obj[2] < carry_z - 0.04:  # lift straight up first
                goal = eef + np.array([0.0, 0.0, carry_z - obj[2]])
            else:  # carry, never lower before it is above the target (high starts)
                goal = eef + np.array([to_target[0], to_target[1], max(carry_z - obj[2], 0.0)])
        elif in_hand and closed:  # closing on the object
            grip, goal = 1.0, eef
        elif np.linalg.norm(to_grasp[:2]) > self.xy_tolerance or not aligned:
            approach_z = max(grasp[2] + 0.1, top + self.hover)
            goal = np.array([grasp[0], grasp[1], approach_z])
        else:
            goal = grasp - np.array([0.0, 0.0, 0.01])
            if eef[2] <= grasp[2] + self.grasp_tolerance:
                grip = 1.0
        action = np.zeros(7, dtype=np.float32)
        action[:3] = np.clip(gain * (goal - eef), -1.0, 1.0)
        if yaw_error is not None:
            action[5] = np.clip(self.yaw_gain * yaw_error, -1.0, 1.0)
        action[6] = grip
        return action
