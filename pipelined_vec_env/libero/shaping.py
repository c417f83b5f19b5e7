"""Dense shaping for LIBERO from the task's bddl goal predicates.

LIBERO's own reward is sparse (1 on success). For RL from scratch we offer a goal
potential ``phi(s)`` in ``[0, 1]`` that works for every task because it reads only the
goal the bddl file states, and `LiberoEnv` adds
``phi(s') - phi(s)``: potential-based shaping, which leaves the optimal policy unchanged
(Ng, Harada and Russell, ICML 1999) and sums to ``phi(end) - phi(start)`` over an
episode, so it cannot be farmed by dawdling.

The goal of a LIBERO task is a conjunction of predicates such as ``("on", "bowl_1",
"plate_1")``, ``("in", "soup_1", "basket_1_contain_region")``, ``("open",
"cabinet_1_top_region")`` or ``("turnon", "stove_1")``. For each predicate ``p``:

* satisfied (LIBERO's own predicate check): ``phi_p = 1``;
* otherwise ``phi_p = 0.25 * (1 - tanh(k * d_grip)) + 0.25 * (1 - tanh(k * d_target))``,
  where ``d_grip`` is the distance (m) from the gripper site to the predicate's first
  object and ``d_target`` the distance from that object to the second one (0 for unary
  predicates), with ``k = 5 / m``. So an unsatisfied predicate is worth at most 0.5.

``phi = mean_p phi_p``; it is 1 exactly when every predicate holds, i.e. on success.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GoalShaping"]


class GoalShaping:
    """Goal potential of a LIBERO (robosuite) task env.

    Args:
        task_env: The inner LIBERO problem env (``ControlEnv(...).env``), exposing
            ``parsed_problem["goal_state"]``, ``object_states_dict``, ``_eval_predicate``,
            ``sim`` and ``robots``.
        distance_scale: ``k`` in the formula above, in 1/m.
    """

    def __init__(self, task_env: Any, distance_scale: float = 5.0) -> None:
        self._env = task_env
        self.distance_scale = float(distance_scale)
        self.predicates: list[tuple[str, ...]] = [
            tuple(p) for p in task_env.parsed_problem["goal_state"]
        ]

    def _position(self, name: str) -> np.ndarray:
        return np.asarray(self._env.object_states_dict[name].get_geom_state()["pos"])

    def predicate_terms(self) -> list[float]:
        """``phi_p`` for each goal predicate, in bddl order (floats in [0, 1])."""
        gripper = np.asarray(self._env.sim.data.site_xpos[self._env.robots[0].eef_site_id])
        terms = []
        for predicate in self.predicates:
            if self._env._eval_predicate(list(predicate)):
                terms.append(1.0)
                continue
            objects = predicate[1:]
            first = self._position(objects[0])
            d_grip = float(np.linalg.norm(gripper - first))
            d_target = (
                float(np.linalg.norm(first - self._position(objects[1])))
                if len(objects) > 1
                else 0.0
            )
            k = self.distance_scale
            terms.append(0.25 * (1 - np.tanh(k * d_grip)) + 0.25 * (1 - np.tanh(k * d_target)))
        return terms

    def fraction_satisfied(self) -> float:
        """Fraction of goal predicates that hold now, in [0, 1]."""
        terms = self.predicate_terms()
        return sum(t == 1.0 for t in terms) / max(len(terms), 1)

    def potential(self) -> float:
        """``phi(s)`` in [0, 1]; 1.0 if and only if every goal predicate holds."""
        terms = self.predicate_terms()
        return float(np.mean(terms)) if terms else 0.0
