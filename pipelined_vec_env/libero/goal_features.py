"""Goal-relative state features of a LIBERO task: the observation behaviour cloning needs.

LIBERO's ``state`` vector (robot proprioception, then 14 values per object) holds every
object of the scene, most of them irrelevant to the task and constant within an episode.
A policy cloned from a few dozen demonstrations on it memorises those constants instead
of reacting to the scene (measured on libero_object task 0: 0/20 held-out init states
from the 137-dim state, 9/20 from these features, 19/20 from these features with noise
injected while collecting; see docs/libero.md). These features keep only what the task's
bddl goal is about: the gripper, the goal's object and its target, and their differences.

They are *privileged* state features: read from the simulator, not from cameras, like
``state`` itself. A policy that uses them is a state-based policy; report it as such.

The goal's predicate is the first of the bddl goal (a conjunction) that does not hold
yet, or the last one when all hold. For a binary predicate ``(pred, object, target)``
(``in``, ``on``) the target is the second argument (an object or a region site); for a
unary one (``open``, ``turnon``) it is the object itself, so the target differences are 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GOAL_FEATURE_NAMES", "GOAL_FEATURE_SLICES", "NUM_GOAL_FEATURES", "GoalFeatures"]

_LAYOUT: tuple[tuple[str, int], ...] = (
    ("eef_pos", 3),
    ("gripper_qpos", 2),
    ("gripper_qvel", 2),
    ("object_pos", 3),
    ("object_top", 1),
    ("target_pos", 3),
    ("object_minus_eef", 3),
    ("target_minus_object", 3),
    ("target_minus_eef", 3),
)


def _slices() -> dict[str, slice]:
    out, start = {}, 0
    for name, size in _LAYOUT:
        out[name] = slice(start, start + size)
        start += size
    return out


GOAL_FEATURE_SLICES: dict[str, slice] = _slices()
"""Name -> slice of the feature vector:

* ``eef_pos`` (3): end-effector (grip site) position, m, world frame;
* ``gripper_qpos`` (2), ``gripper_qvel`` (2): the two finger joints (m, m/s); their
  difference is the finger opening (about 0.08 open, 0 closed on nothing);
* ``object_pos`` (3): position of the goal's object (its body origin), m;
* ``object_top`` (1): height of the object's highest collision point, m (where a hand
  coming from above would touch it);
* ``target_pos`` (3): position of the goal's target (object or region site), m;
* ``object_minus_eef``, ``target_minus_object``, ``target_minus_eef`` (3 each): the
  differences, m.
"""

NUM_GOAL_FEATURES: int = sum(size for _, size in _LAYOUT)
"""Length of the feature vector (23)."""

GOAL_FEATURE_NAMES: tuple[str, ...] = tuple(
    f"{name}_{i}" if size > 1 else name for name, size in _LAYOUT for i in range(size)
)
"""One name per feature, e.g. ``eef_pos_0`` ... ``target_minus_eef_2``."""


class GoalFeatures:
    """Compute the goal-relative features of a LIBERO (robosuite) task env.

    Args:
        task_env: The inner LIBERO problem env (``ControlEnv(...).env``), exposing
            ``parsed_problem["goal_state"]``, ``object_states_dict``, ``obj_body_id``,
            ``_eval_predicate``, ``sim`` and ``robots``.

    Examples:
        >>> features = GoalFeatures(control_env.env)  # doctest: +SKIP
        >>> features().shape  # doctest: +SKIP
        (23,)
    """

    def __init__(self, task_env: Any) -> None:
        self._env = task_env
        self.predicates: list[tuple[str, ...]] = [
            tuple(p) for p in task_env.parsed_problem["goal_state"]
        ]
        robot = task_env.robots[0]
        self._eef_site = robot.eef_site_id
        self._finger_qpos = list(robot._ref_gripper_joint_pos_indexes)
        self._finger_qvel = list(robot._ref_gripper_joint_vel_indexes)
        model = task_env.sim.model
        # collision geoms of each object body (objects hang off the world by a free joint)
        self._geoms: dict[str, np.ndarray] = {}
        for name, body in task_env.obj_body_id.items():
            ids = [
                g
                for g in range(model.ngeom)
                if model.body_rootid[model.geom_bodyid[g]] == body
                and (model.geom_contype[g] or model.geom_conaffinity[g])
            ]
            self._geoms[name] = np.asarray(ids, dtype=np.int64)

    def _predicate(self) -> tuple[str, ...]:
        for predicate in self.predicates:
            if not self._env._eval_predicate(list(predicate)):
                return predicate
        return self.predicates[-1]

    def _position(self, name: str) -> np.ndarray:
        return np.asarray(
            self._env.object_states_dict[name].get_geom_state()["pos"], dtype=np.float64
        )

    def _top(self, name: str, fallback: float) -> float:
        ids = self._geoms.get(name)
        if ids is None or len(ids) == 0:
            return fallback
        model, data = self._env.sim.model, self._env.sim.data
        aabb = np.asarray(model.geom_aabb)[ids]  # (n, 6): centre then half sizes, geom frame
        xmat = np.asarray(data.geom_xmat)[ids].reshape(-1, 3, 3)
        # world z of each geom's box centre, and its half height after rotation
        centre_z = np.asarray(data.geom_xpos)[ids, 2] + np.einsum(
            "nj,nj->n", xmat[:, 2, :], aabb[:, :3]
        )
        half_z = np.einsum("nj,nj->n", np.abs(xmat[:, 2, :]), aabb[:, 3:])
        return float(np.max(centre_z + half_z))

    def __call__(self) -> np.ndarray:
        """The features now: float32 ``(NUM_GOAL_FEATURES,)`` laid out as ``GOAL_FEATURE_SLICES``."""
        data = self._env.sim.data
        predicate = self._predicate()
        eef = np.asarray(data.site_xpos[self._eef_site], dtype=np.float64)
        qpos = np.asarray(data.qpos[self._finger_qpos], dtype=np.float64)
        qvel = np.asarray(data.qvel[self._finger_qvel], dtype=np.float64)
        obj = self._position(predicate[1])
        target = self._position(predicate[2]) if len(predicate) > 2 else obj
        top = self._top(predicate[1], fallback=float(obj[2]))
        return np.concatenate(
            [eef, qpos, qvel, obj, [top], target, obj - eef, target - obj, target - eef]
        ).astype(np.float32)
