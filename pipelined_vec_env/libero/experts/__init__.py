"""Scripted experts for LIBERO tasks, one module per behaviour family, and the task table.

Every expert is a pure function of the current observation (``goal_features``, and
``state`` where it reads neighbours): the same observation gives the same action, so
any state can be labelled (DART noise injection, DAgger). `expert_for` picks the expert
of one task; `TaskExperts` labels a batch whose rows come from different tasks.

Families:

* `pick_place` (`PickPlaceExpert`): pick the goal's object, place it on / in the target
  (libero_object, libero_spatial, the placing tasks of libero_goal, and libero_goal's
  "push the plate to the front of the stove", done by carrying the plate by its rim).
* `knob` (`KnobExpert`): turn a stove's knob on, pushing its handle round with a finger
  (libero_goal's "turn on the stove").

Tasks without an expert (`has_expert` is False): opening a drawer (libero_goal tasks 0
and 3), libero_10 and libero_90.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from ..suites import check_suite
from .knob import KnobExpert
from .pick_place import PickPlaceExpert

__all__ = [
    "Expert",
    "KnobExpert",
    "PickPlaceExpert",
    "TaskExperts",
    "expert_for",
    "has_expert",
    "tasks_with_experts",
]


class Expert(Protocol):
    """What `collect_demos` and the trainers call: ``act(obs) -> (B, 7)`` actions."""

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Actions ``(B, 7)`` (or ``(7,)``) float32 in ``[-1, 1]`` for a (batched) obs dict."""
        ...


# a bowl (wider than the open gripper) is grasped by its rim, 4.7 cm from its axis
_RIM = {"rim_offset": 0.047, "grasp_depth": 0.02, "xy_tolerance": 0.016}

# a plate is lifted by its rim too (radius ~4.8 cm, ~1.6 cm high) and set down in place
# libero_spatial: the arm stalls up to ~1.6 cm short of the plate's centre when it carries
# a bowl there; the plate is wide enough to release it up to 3 cm off
_SPATIAL = {**_RIM, "place_tolerance": 0.03}

_PLATE = {"rim_offset": 0.048, "grasp_depth": 0.006, "xy_tolerance": 0.016}

_FACTORIES: dict[str, dict[int, Callable[[], Expert]]] = {
    "libero_object": {t: PickPlaceExpert for t in range(10)},
    "libero_spatial": {
        **{t: (lambda: PickPlaceExpert(**_SPATIAL)) for t in range(10)},
        # the bowl in the top drawer: the drawer's front panel and the cabinet leave no room
        # for a finger beside the rim along y; turn the hand so that the fingers close
        # along x, and carry it higher, clear of the cabinet
        4: lambda: PickPlaceExpert(**_SPATIAL, grasp_yaw=np.pi / 2, carry_height=0.25),
        # the bowl tipped over the ramekin (~50 degrees): grasp its rim where it is
        5: lambda: PickPlaceExpert(**_SPATIAL, tilt_grasp=True),
        # a faster carry: the arm stalls short of the plate at gain 10 (init states 1, 9)
        6: lambda: PickPlaceExpert(**_SPATIAL, place_gain=30.0),
    },
    "libero_goal": {
        1: lambda: PickPlaceExpert(**_RIM),  # the bowl on the stove
        # the wine bottle on top of the cabinet: the arm stalls ~1.7 cm short of its
        # centre at that height; the top is wide enough to release 3 cm off
        2: lambda: PickPlaceExpert(place_tolerance=0.03),
        4: lambda: PickPlaceExpert(**_RIM),  # the bowl on top of the cabinet
        5: lambda: PickPlaceExpert(**_PLATE),  # the plate to the front of the stove
        6: PickPlaceExpert,  # the cream cheese in the bowl
        7: KnobExpert,  # turn on the stove
        8: lambda: PickPlaceExpert(**_RIM),  # the bowl on the plate
        9: PickPlaceExpert,  # the wine bottle on the rack
    },
}


def has_expert(suite: str, task_id: int) -> bool:
    """Whether `expert_for` has an expert for this task (unknown suites raise)."""
    check_suite(suite)
    return int(task_id) in _FACTORIES.get(suite, {})


def tasks_with_experts(suite: str) -> list[int]:
    """Task ids of ``suite`` that have an expert, ascending."""
    check_suite(suite)
    return sorted(_FACTORIES.get(suite, {}))


def expert_for(suite: str, task_id: int) -> Expert:
    """The scripted expert of one LIBERO task.

    Args:
        suite: A LIBERO suite, e.g. ``"libero_spatial"``.
        task_id: Task index in LIBERO's order.

    Returns:
        A fresh expert with the task's settings (e.g. a rim grasp for bowls).

    Raises:
        ValueError: For an unknown suite or a task id out of range.
        NotImplementedError: For a task whose behaviour no expert has yet (see
            `tasks_with_experts`).
    """
    check_suite(suite)
    n = 90 if suite == "libero_90" else 10  # LIBERO's task counts (no simulator import)
    if not 0 <= int(task_id) < n:
        raise ValueError(f"task_id: expected an int in [0, {n}) for {suite}, got {task_id}")
    factory = _FACTORIES.get(suite, {}).get(int(task_id))
    if factory is None:
        raise NotImplementedError(
            f"no scripted expert for {suite} task {task_id}; tasks with one: "
            f"{tasks_with_experts(suite)}"
        )
    return factory()


class TaskExperts:
    """Label a batch whose row ``i`` comes from task ``task_ids[i]`` of one suite.

    Args:
        suite: The suite of every row.
        task_ids: One task id per batch row (repeats allowed).

    Raises:
        ValueError, NotImplementedError: As `expert_for`, for any of the tasks.

    Examples:
        >>> experts = TaskExperts("libero_object", [0, 3])  # doctest: +SKIP
        >>> experts.act(obs).shape  # obs batched over the 2 envs  # doctest: +SKIP
        (2, 7)
    """

    def __init__(self, suite: str, task_ids: Sequence[int]) -> None:
        self.suite = suite
        self.task_ids = [int(t) for t in task_ids]
        self.experts = [expert_for(suite, t) for t in self.task_ids]

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Actions ``(B, 7)`` for an obs dict batched over ``B = len(task_ids)`` rows.

        Raises:
            ValueError: If the batch has another number of rows than ``task_ids``.
        """
        rows = len(next(iter(obs.values())))
        if rows != len(self.experts):
            raise ValueError(
                f"obs: expected {len(self.experts)} rows (one per task id), got {rows}"
            )
        out = [
            expert.act({k: np.asarray(v[i : i + 1]) for k, v in obs.items()})[0]
            for i, expert in enumerate(self.experts)
        ]
        return np.stack(out).astype(np.float32)
