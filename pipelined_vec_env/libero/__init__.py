"""Real LIBERO tasks as gymnasium envs (optional extra: ``pip install pipelined-vec-env[libero]``).

Importing this subpackage registers the gymnasium ids of
`registration` and nothing heavier: ``libero``,
``robosuite`` and ``mujoco`` are imported only when an env is built. The names below
are loaded on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from .registration import LIBERO_ENV_IDS, register_libero_envs
from .suites import (
    NUM_SETTLE_STEPS,
    STANDARD_SUITES,
    SUITE_HORIZONS,
    LiberoTask,
    get_task,
    list_init_state_ids,
    list_tasks,
    load_init_states,
    num_tasks,
    suite_state_size,
    task_state_size,
)

__all__ = [
    "LIBERO_ENV_IDS",
    "NUM_SETTLE_STEPS",
    "STANDARD_SUITES",
    "SUITE_HORIZONS",
    "Demo",
    "DemoSet",
    "GoalFeatures",
    "GoalShaping",
    "InitStateCycle",
    "LiberoEnv",
    "LiberoTask",
    "PickPlaceExpert",
    "collect_demos",
    "get_task",
    "list_init_state_ids",
    "list_tasks",
    "load_demos",
    "load_init_states",
    "num_tasks",
    "register_libero_envs",
    "suite_state_size",
    "task_state_size",
    "write_demos",
]

_LAZY = {
    "LiberoEnv": ".env",
    "GoalShaping": ".shaping",
    "GoalFeatures": ".goal_features",
    "PickPlaceExpert": ".expert",
    "InitStateCycle": ".collect",
    "collect_demos": ".collect",
    "Demo": ".demos",
    "DemoSet": ".demos",
    "load_demos": ".demos",
    "write_demos": ".demos",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_libero_envs()
