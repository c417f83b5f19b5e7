"""The stove-knob expert: its phases on synthetic features, and libero_goal task 7.

The first tests need no simulator (the expert is a pure function of the features); the
last runs real LIBERO and skips without it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipelined_vec_env.libero.experts import KnobExpert, expert_for
from pipelined_vec_env.libero.goal_features import GOAL_FEATURE_SLICES, NUM_GOAL_FEATURES

from .conftest import needs_libero

S = GOAL_FEATURE_SLICES
AXIS = np.array([-0.40, 0.20, 0.905])  # the stove's origin: the knob's hinge
TOP = AXIS[2] + 0.05  # the handle's top


def _features(eef) -> np.ndarray:
    """Features of the stove goal (unary: the target is the stove) with the hand at ``eef``."""
    f = np.zeros(NUM_GOAL_FEATURES)
    eef = np.asarray(eef, dtype=float)
    f[S["eef_pos"]] = eef
    f[S["gripper_qpos"]] = [0.04, -0.04]
    f[S["object_pos"]] = AXIS
    f[S["object_top"]] = TOP
    f[S["target_pos"]] = AXIS
    f[S["object_minus_eef"]] = AXIS - eef
    f[S["target_minus_eef"]] = AXIS - eef
    return f


def _eef_at(expert: KnobExpert, angle: float, z: float) -> np.ndarray:
    """The end-effector position that puts the pushing finger at ``angle`` on the circle."""
    finger = AXIS[:2] + expert.radius * np.array([np.cos(angle), np.sin(angle)])
    return np.array([finger[0], finger[1] + expert.finger_offset, z])


def test_knob_expert_phases_read_from_the_features_alone():
    expert = KnobExpert()
    push_z = TOP - expert.push_depth
    # far from the knob (the robot's start pose): towards the start point, gripper open
    a = expert(_features([-0.21, 0.0, 1.19]))
    assert a.dtype == np.float32 and a.shape == (7,)
    assert a[0] < -0.9 and a[1] > 0.9 and a[2] < -0.9
    assert a[6] == -1 and np.all(a[3:6] == 0)
    # above the start point, clear of the handle: descend straight down
    a = expert(_features(_eef_at(expert, expert.start_angle, TOP + expert.hover)))
    assert a[2] < -0.1 and np.allclose(a[:2], 0, atol=1e-6)
    # at the start, at the push height: push the handle round (+y mostly), stay level
    a = expert(_features(_eef_at(expert, expert.start_angle, push_z)))
    assert a[1] > 0.2 and abs(a[1]) > 2 * abs(a[0]) and abs(a[2]) < 1e-6
    # half way round: keep turning counterclockwise (now -x as well as +y)
    a = expert(_features(_eef_at(expert, 0.8, push_z)))
    assert a[0] < -0.1 and abs(a[2]) < 1e-6
    # past the end angle, still low: rise and start over
    a = expert(_features(_eef_at(expert, expert.end_angle + 0.2, push_z)))
    assert a[2] > 0.2


def test_knob_expert_is_a_pure_batched_function():
    expert = KnobExpert()
    rng = np.random.default_rng(0)
    rows = np.stack([_features(AXIS + rng.normal(0, 0.05, 3) + [0, 0, 0.05]) for _ in range(8)])
    out = expert(rows)
    assert out.shape == (8, 7) and out.dtype == np.float32 and np.all(np.abs(out) <= 1)
    np.testing.assert_array_equal(out, np.stack([expert(r) for r in rows]))
    np.testing.assert_array_equal(expert.act({"goal_features": rows[::-1]}), out[::-1])
    assert expert(np.zeros((0, NUM_GOAL_FEATURES))).shape == (0, 7)
    assert expert_for("libero_goal", 7) == KnobExpert()
    with pytest.raises(dataclasses.FrozenInstanceError):
        expert.radius = 0.05  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"features: expected shape \(23,\)"):
        expert(np.zeros(5))
    with pytest.raises(KeyError, match="goal_features"):
        expert.act({"state": np.zeros((1, 10))})


@needs_libero
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_knob_expert_turns_on_the_stove():
    from pipelined_vec_env.libero.env import LiberoEnv

    # measured on init states 0-49 (docs/libero.md); ~100 steps an episode
    env = LiberoEnv("libero_goal", 7, state_features="both")
    expert = expert_for("libero_goal", 7)
    wins = 0
    try:
        for k in (0, 1):
            obs, _ = env.reset(options={"init_state_id": k})
            terminated = truncated = False
            while not (terminated or truncated):
                obs, _, terminated, truncated, _ = env.step(expert.act(obs))
            wins += int(terminated)
    finally:
        env.close()
    assert wins == 2
