"""LIBERO suite metadata, gymnasium ids and lazy imports (no simulator is built here)."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest

from pipelined_vec_env.libero import (
    LIBERO_ENV_IDS,
    STANDARD_SUITES,
    SUITE_HORIZONS,
    get_task,
    list_init_state_ids,
    load_init_states,
    suite_state_size,
    task_state_size,
)
from pipelined_vec_env.libero._state_sizes import STATE_SIZES


def test_importing_the_package_imports_no_simulator() -> None:
    code = (
        "import sys, gymnasium as gym, pipelined_vec_env, pipelined_vec_env.libero\n"
        "heavy = [m for m in ('libero', 'robosuite', 'mujoco') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert 'pipelined_vec_env/libero_spatial-v0' in gym.registry\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_robosuite_macro_file_notice_is_dropped_and_other_messages_pass() -> None:
    pytest.importorskip("robosuite")

    def import_robosuite(quiet: bool) -> str:
        code = (
            "import logging\n"
            "from pipelined_vec_env.libero import suites\n"
            + ("suites.quiet_robosuite_import()\n" if quiet else "")
            + "import robosuite\n"
            "logging.getLogger('robosuite_logs').warning('another robosuite warning')\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return done.stderr

    assert "private macro file" in import_robosuite(quiet=False)  # what LiberoEnv hides
    quiet = import_robosuite(quiet=True)
    assert "macro file" not in quiet and "setup_macros" not in quiet
    assert "another robosuite warning" in quiet


def test_ids_horizons_and_state_sizes_cover_every_suite() -> None:
    assert set(LIBERO_ENV_IDS) == set(SUITE_HORIZONS) == set(STATE_SIZES) == set(STANDARD_SUITES)
    for suite, env_id in LIBERO_ENV_IDS.items():
        spec = gym.spec(env_id)
        assert spec.entry_point == "pipelined_vec_env.libero.env:LiberoEnv"
        assert spec.kwargs == {"suite": suite}
    assert {s: len(v) for s, v in STATE_SIZES.items()} == {
        "libero_spatial": 10,
        "libero_object": 10,
        "libero_goal": 10,
        "libero_10": 10,
        "libero_90": 90,
    }
    for suite, sizes in STATE_SIZES.items():
        # 39 Panda proprio values, then 14 per object (pos, quat, both relative to the gripper)
        assert all(s > 39 and (s - 39) % 14 == 0 for s in sizes), (suite, sizes)
        assert (
            suite_state_size(suite)
            == max(sizes)
            == max(task_state_size(suite, t) for t in range(len(sizes)))
        )


def test_tasks_and_init_state_ids() -> None:
    pytest.importorskip("libero")
    task = get_task("libero_object", 0)
    assert task.language and task.bddl_path.endswith(".bddl")
    states = load_init_states("libero_object", 0)
    assert states.dtype.name == "float64" and states.ndim == 2 and len(states) == 50
    ids = list_init_state_ids("libero_spatial")
    assert len(ids) == 500 and ids[0] == (0, 0) and ids[-1] == (9, 49)
    assert list_init_state_ids("libero_goal", task_ids=[2]) == [(2, k) for k in range(50)]
    with pytest.raises(ValueError, match="libero_spatial"):
        get_task("libero_100", 0)
    with pytest.raises(ValueError, match="out of range"):
        get_task("libero_goal", 10)
