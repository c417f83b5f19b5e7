"""Orientation helpers of the scripted experts: the hand's yaw and a tilted object's rim.

Quaternions are robosuite's ``(x, y, z, w)`` order, as LIBERO's ``state`` holds them (the
end effector's at ``state[31:35]``, each object's at offset 3 of its 14-value block).
Angles are radians, lengths metres, all in the world frame.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "EEF_QUAT",
    "OBJECT_BLOCK",
    "OBJECT_STATE_START",
    "hand_yaw",
    "object_quat",
    "quat_to_matrix",
    "rim_point",
    "wrap_angle",
]

EEF_QUAT = slice(31, 35)
"""The end effector's quaternion in the Panda's ``robot0_proprio-state``."""

OBJECT_STATE_START = 39
"""Index of the first object's block in ``state`` (after the 39 proprio values)."""

OBJECT_BLOCK = 14
"""Values per object in ``state``: position 3, quaternion 4, then both relative to the hand."""


def quat_to_matrix(quat: np.ndarray) -> np.ndarray:
    """Rotation matrix ``(3, 3)`` of an ``(x, y, z, w)`` quaternion (normalised first)."""
    x, y, z, w = np.asarray(quat, dtype=np.float64) / np.linalg.norm(quat)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def wrap_angle(angle: float) -> float:
    """``angle`` (rad) wrapped into ``[-pi, pi)``."""
    return float((angle + np.pi) % (2 * np.pi) - np.pi)


def hand_yaw(eef_quat: np.ndarray) -> float:
    """Yaw (rad) of the hand about world z: the heading of its x axis in the xy plane.

    The Panda's initial top-down orientation (hand x along world x, fingers closing along
    world y) has yaw 0; turning the hand by +pi/2 about z makes the fingers close along x.
    """
    rot = quat_to_matrix(eef_quat)
    return float(np.arctan2(rot[1, 0], rot[0, 0]))


def object_quat(
    state: np.ndarray, position: np.ndarray, tolerance: float = 5e-3
) -> np.ndarray | None:
    """Quaternion of the ``state`` object at ``position`` (m), None if none is that close."""
    blocks = state[OBJECT_STATE_START:]
    blocks = blocks[: len(blocks) // OBJECT_BLOCK * OBJECT_BLOCK].reshape(-1, OBJECT_BLOCK)
    blocks = blocks[np.abs(blocks[:, 3:7]).sum(1) > 0]  # zero padding has no quaternion
    if not len(blocks):
        return None
    distance = np.linalg.norm(blocks[:, :3] - position, axis=1)
    nearest = int(np.argmin(distance))
    return blocks[nearest, 3:7] if distance[nearest] < tolerance else None


def rim_point(
    position: np.ndarray, top: float, quat: np.ndarray, direction: np.ndarray, radius: float
) -> np.ndarray:
    """The point ``(3,)`` of a (possibly tilted) bowl's rim on the side ``direction`` points to.

    The rim is a circle of ``radius`` (m) perpendicular to the object's axis ``a`` (its
    local z, from the ``(x, y, z, w)`` ``quat``), centred on the axis; its highest point is
    the object's ``top`` (m), so the centre is ``radius * sin(tilt)`` below it. The point
    returned is the rim's point towards the horizontal ``direction`` ``(dx, dy)`` (its
    component along the axis removed). Upright, this is ``position + radius * direction``
    at height ``top``.
    """
    axis = quat_to_matrix(quat)[:, 2]
    if axis[2] < 0.2:  # lying on its side or upside down: no rim to grasp from above
        axis = np.array([0.0, 0.0, 1.0])
    centre_z = top - radius * np.sqrt(max(1.0 - axis[2] ** 2, 0.0))
    centre = np.asarray(position, dtype=np.float64) + axis * (centre_z - position[2]) / axis[2]
    across = np.array([direction[0], direction[1], 0.0], dtype=np.float64)
    across -= across.dot(axis) * axis
    return centre + radius * across / np.linalg.norm(across)
