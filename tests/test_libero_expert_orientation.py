"""The expert's orientation-aware behaviours (turned hand, tilted rim, placing gain).

All on synthetic observations, no simulator: the orientation helpers, yaw control, the
rim grasp point of a tilted bowl, and that the tasks which do not opt in keep the hand
top-down.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipelined_vec_env.libero.experts import PickPlaceExpert, expert_for
from pipelined_vec_env.libero.experts._orientation import (
    hand_yaw,
    object_quat,
    quat_to_matrix,
    rim_point,
    wrap_angle,
)
from pipelined_vec_env.libero.goal_features import GOAL_FEATURE_SLICES, NUM_GOAL_FEATURES

S = GOAL_FEATURE_SLICES
TOP_DOWN = np.array([1.0, 0.0, 0.0, 0.0])  # the Panda's initial hand: pi about x, (x, y, z, w)


def _quat_z(angle: float) -> np.ndarray:
    """``(x, y, z, w)`` quaternion of a rotation by ``angle`` about z."""
    return np.array([0.0, 0.0, np.sin(angle / 2), np.cos(angle / 2)])


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of ``(x, y, z, w)`` quaternions: rotation ``b``, then ``a``."""
    (ax, ay, az, aw), (bx, by, bz, bw) = a, b
    return np.array(
        [
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
            aw * bw - ax * bx - ay * by - az * bz,
        ]
    )


def _tilted(angle: float, about: str) -> np.ndarray:
    """A bowl (LIBERO's turned 90 degrees about z) tipped by ``angle`` about world x or y."""
    half = angle / 2
    tip = np.array([np.sin(half), 0.0, 0.0, np.cos(half)])
    if about == "y":
        tip = np.array([0.0, np.sin(half), 0.0, np.cos(half)])
    return _quat_mul(tip, _quat_z(np.pi / 2))


def phase_observations(seed: int = 0, rows: int = 400, state_size: int = 109) -> dict:
    """Observations near every phase: approach, descent, grasp, hold, carry, release."""
    rng = np.random.default_rng(seed)
    f = np.zeros((rows, NUM_GOAL_FEATURES))
    obj = np.c_[rng.uniform(-0.2, 0.2, (rows, 2)), rng.uniform(0.85, 1.1, rows)]
    target = np.c_[rng.uniform(-0.2, 0.2, (rows, 2)), rng.uniform(0.85, 1.0, rows)]
    near = rng.random(rows) < 0.3  # the object carried close above its target
    obj[near, :2] = target[near, :2] + rng.normal(0, 0.02, (near.sum(), 2))
    obj[near, 2] = target[near, 2] + rng.uniform(0.0, 0.3, near.sum())
    top = obj[:, 2] + rng.uniform(0.005, 0.1, rows)
    rim = rng.choice([0.0, 0.047, 0.048], rows)
    grasp_z = np.maximum(obj[:, 2], top - rng.choice([0.006, 0.02, 0.04], rows))
    eef = np.c_[obj[:, 0], obj[:, 1] + rim, grasp_z] + rng.normal(0, 0.01, (rows, 3))
    far = rng.random(rows) < 0.2
    eef[far] += rng.uniform(-0.3, 0.3, (far.sum(), 3))
    eef[:, 2] += rng.choice([0.0, 0.0, 0.02, 0.1], rows)
    width = rng.choice([0.079, 0.074, 0.06, 0.03], rows)
    speed = rng.choice([0.0, 0.0, 0.005, 0.05], rows)
    f[:, S["eef_pos"]] = eef
    f[:, S["gripper_qpos"]] = np.c_[width / 2, -width / 2]
    f[:, S["gripper_qvel"]] = np.c_[speed, -speed]
    f[:, S["object_pos"]] = obj
    f[:, S["object_top"]] = top[:, None]
    f[:, S["target_pos"]] = target
    f[:, S["object_minus_eef"]] = obj - eef
    f[:, S["target_minus_object"]] = target - obj
    f[:, S["target_minus_eef"]] = target - eef
    state = np.zeros((rows, state_size))
    state[:, 28:31] = eef
    state[:, 31:35] = TOP_DOWN
    for b in range(5):  # the goal's object, then neighbours around it
        at = 39 + 14 * b
        offset = 0.0 if b == 0 else rng.uniform(-0.15, 0.15, (rows, 3))
        state[:, at : at + 3] = obj + offset
        state[:, at + 3 : at + 7] = [0.0, 0.0, 0.0, 1.0]
    return {"goal_features": f, "state": state}


# the tasks whose expert uses none of the orientation behaviours
_TOP_DOWN_TASKS = [
    *(("libero_object", t) for t in range(10)),
    *(("libero_spatial", t) for t in (0, 1, 2, 3, 7, 8, 9)),
    *(("libero_goal", t) for t in (1, 2, 4, 5, 6, 8, 9)),
]


@pytest.mark.parametrize(("suite", "task_id"), _TOP_DOWN_TASKS)
def test_tasks_that_do_not_opt_in_keep_the_hand_top_down(suite, task_id):
    obs = phase_observations()
    expert = expert_for(suite, task_id)
    assert expert.grasp_yaw is None and not expert.tilt_grasp and expert.place_gain is None
    actions = expert.act(obs)
    assert (actions[:, 6] > 0).any() and (actions[:, 6] < 0).any()  # grasping, releasing
    assert np.all(actions[:, 3:6] == 0)
    alone = expert.act({"goal_features": obs["goal_features"]})  # no state: no neighbours
    assert np.all(alone[:, 3:6] == 0) and alone.shape == actions.shape


def test_orientation_helpers():
    np.testing.assert_allclose(quat_to_matrix([0, 0, 0, 2.0]), np.eye(3))
    np.testing.assert_allclose(quat_to_matrix(TOP_DOWN), np.diag([1.0, -1.0, -1.0]))
    assert wrap_angle(3 * np.pi / 2) == pytest.approx(-np.pi / 2)
    assert wrap_angle(-0.25) == pytest.approx(-0.25)
    assert hand_yaw(TOP_DOWN) == pytest.approx(0.0)
    for yaw in (0.3, np.pi / 2, -np.pi / 2, 2.5):  # the hand turned about world z
        assert hand_yaw(_quat_mul(_quat_z(yaw), TOP_DOWN)) == pytest.approx(yaw)
    state = np.zeros(39 + 14 * 3)
    state[39:42], state[42:46] = [0.1, 0.2, 0.9], _quat_z(0.5)
    state[53:56], state[56:60] = [0.3, 0.2, 0.9], _quat_z(1.0)
    np.testing.assert_allclose(object_quat(state, np.array([0.3, 0.2, 0.901])), _quat_z(1.0))
    assert object_quat(state, np.array([0.0, 0.0, 0.0])) is None  # nothing there (padding)


def test_rim_point_upright_and_tilted():
    position, top, radius = np.array([0.1, 0.2, 0.9]), 0.953, 0.047
    upright = rim_point(position, top, _quat_z(np.pi / 2), np.array([0.0, 1.0]), radius)
    np.testing.assert_allclose(upright, [0.1, 0.2 + radius, top])
    for about, tilt in (("x", 0.3), ("y", 0.9), ("x", -0.5)):
        quat = _tilted(tilt, about)
        axis = quat_to_matrix(quat)[:, 2]
        points = [rim_point(position, top, quat, np.array(d), radius) for d in ([0, 1], [1, 0])]
        centre_z = top - radius * abs(np.sin(tilt))  # the rim's highest point is the top
        for p in points:
            centre = position + axis * (centre_z - position[2]) / axis[2]
            assert np.linalg.norm(p - centre) == pytest.approx(radius)  # on the rim circle
            assert np.dot(p - centre, axis) == pytest.approx(0.0, abs=1e-12)
    # tipped about x by +0.3 (the axis leans to -y): the +y side of the rim is the top, the
    # -y side is lower by the rim's diameter times the sine of the tilt
    high = rim_point(position, top, _tilted(0.3, "x"), np.array([0.0, 1.0]), radius)
    low = rim_point(position, top, _tilted(0.3, "x"), np.array([0.0, -1.0]), radius)
    assert high[2] == pytest.approx(top)
    assert low[2] == pytest.approx(top - 2 * radius * np.sin(0.3))


def _obs(eef, obj, target, eef_quat=TOP_DOWN, obj_quat=None, width=0.079, top=None) -> dict:
    eef, obj, target = (np.asarray(v, dtype=float) for v in (eef, obj, target))
    f = np.zeros(NUM_GOAL_FEATURES)
    f[S["eef_pos"]], f[S["object_pos"]], f[S["target_pos"]] = eef, obj, target
    f[S["gripper_qpos"]] = [width / 2, -width / 2]
    f[S["object_top"]] = obj[2] + 0.053 if top is None else top
    f[S["object_minus_eef"]] = obj - eef
    f[S["target_minus_object"]] = target - obj
    f[S["target_minus_eef"]] = target - eef
    state = np.zeros(39 + 14 * 2)
    state[28:31], state[31:35] = eef, eef_quat
    state[39:42] = obj
    state[42:46] = _quat_z(np.pi / 2) if obj_quat is None else obj_quat
    return {"goal_features": f, "state": state}


def test_yaw_control_turns_the_hand_before_it_descends():
    expert = PickPlaceExpert(rim_offset=0.047, grasp_depth=0.02, grasp_yaw=np.pi / 2)
    obj, target = [0.1, -0.13, 1.06], [0.05, 0.2, 0.9]
    rim = [0.1 - 0.047, -0.13]  # the grasp point turns with the hand: -x of the axis
    # right above the rim, hand not turned yet: turn (+z), stay at the approach height
    a = expert.act(_obs([*rim, 1.15], obj, target))
    assert a[5] == 1.0 and a[2] > 0 and a[6] == -1
    assert np.all(a[3:5] == 0)
    # turned by 90 degrees: descend onto the rim, holding the yaw
    turned = _quat_mul(_quat_z(np.pi / 2), TOP_DOWN)
    a = expert.act(_obs([*rim, 1.15], obj, target, eef_quat=turned))
    assert a[2] < -0.5 and a[5] == pytest.approx(0.0, abs=1e-6)
    # slightly over-turned: a proportional correction back (yaw_gain per radian)
    over = _quat_mul(_quat_z(np.pi / 2 + 0.1), TOP_DOWN)
    assert expert.act(_obs([*rim, 1.2], obj, target, eef_quat=over))[5] == pytest.approx(-0.2)
    # far off: the approach point is above the turned rim point
    a = expert.act(_obs([-0.2, 0.0, 1.2], obj, target, eef_quat=turned))
    assert a[0] > 0.9 and a[1] < -0.9
    # without the state (no hand orientation), no rotation is commanded
    assert expert.act({"goal_features": _obs([*rim, 1.2], obj, target)["goal_features"]})[5] == 0


def test_tilted_bowl_is_grasped_where_its_rim_is():
    obj, target = np.array([-0.25, 0.21, 0.926]), [0.05, 0.2, 0.9]
    quat = _tilted(-0.4, "x")  # the axis leans to +y: the +y side of the rim drops
    top = obj[2] + 0.06
    expert = PickPlaceExpert(rim_offset=0.047, grasp_depth=0.02, tilt_grasp=True)
    rim = rim_point(obj, top, quat, np.array([0.0, 0.047]), 0.047)
    assert rim[2] < top - 0.03
    # above the rim point: descend to 2 cm below it, not 2 cm below the top
    a = expert.act(_obs([rim[0], rim[1], rim[2] + 0.05], obj, target, obj_quat=quat, top=top))
    assert a[2] == pytest.approx(10 * (rim[2] - 0.02 - 0.01 - rim[2] - 0.05), abs=1e-6)
    # upright, the grasp is the untilted expert's
    upright = _obs([-0.25, 0.257, 1.0], obj, target, top=top)
    np.testing.assert_array_equal(
        expert.act(upright), PickPlaceExpert(rim_offset=0.047, grasp_depth=0.02).act(upright)
    )


def test_place_gain_applies_while_lowering_only():
    base = PickPlaceExpert()
    fast = PickPlaceExpert(place_gain=30.0)
    target = [0.05, 0.2, 0.9]
    # holding, 1.5 cm short of the target, being lowered: three times the xy action
    held = _obs([0.065, 0.2, 1.015], [0.065, 0.2, 1.0], target, width=0.06)
    slow_a, fast_a = base.act(held), fast.act(held)
    assert fast_a[0] == pytest.approx(3 * slow_a[0]) and fast_a[6] == slow_a[6] == 1
    # lifting, or moving to the object: the same actions
    for obs in (
        _obs([0.2, -0.1, 0.915], [0.2, -0.1, 0.9], target, width=0.06),
        _obs([-0.2, 0.0, 1.2], [0.2, -0.1, 0.9], target),
    ):
        np.testing.assert_array_equal(fast.act(obs), base.act(obs))
    lifting = fast.act(_obs([0.2, -0.1, 0.915], [0.2, -0.1, 0.9], target, width=0.06))
    assert lifting[2] > 0.9 and lifting[6] == 1
