"""LiberoEnv on the real benchmark: one state-only env shared by the module (~1 GB)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("libero")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from pipelined_vec_env.libero import SUITE_HORIZONS, get_task, load_init_states  # noqa: E402
from pipelined_vec_env.libero.env import LiberoEnv  # noqa: E402

SUITE, TASK = "libero_spatial", 0  # goal: ("on", "akita_black_bowl_1", "plate_1")
NOOP = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)


@pytest.fixture(scope="module")
def env() -> Iterator[LiberoEnv]:
    env = LiberoEnv(SUITE, TASK)
    yield env
    env.close()


@pytest.fixture
def fresh(env: LiberoEnv) -> Iterator[LiberoEnv]:
    """The shared env with its public knobs restored after the test."""
    yield env
    env.horizon, env.num_settle_steps, env.reward_type = SUITE_HORIZONS[SUITE], 10, "sparse"


def place_bowl_on_plate(env: LiberoEnv) -> None:
    """Teleport the bowl 5 cm above the plate, at rest; gravity does the rest."""
    task_env = env._sim_env.env
    plate = task_env.object_states_dict["plate_1"].get_geom_state()["pos"].copy()
    joint = task_env.get_object("akita_black_bowl_1").joints[-1]
    task_env.sim.data.set_joint_qpos(joint, np.concatenate([plate + [0, 0, 0.05], [1, 0, 0, 0]]))
    task_env.sim.data.set_joint_qvel(joint, np.zeros(6))
    task_env.sim.forward()


def test_spaces_and_check_env(env: LiberoEnv) -> None:
    assert set(env.observation_space.spaces) == {"state"}
    assert env.observation_space["state"].dtype == np.float32
    assert env.action_space.shape == (7,)
    assert env.action_space.low.min() == -1 and env.action_space.high.max() == 1
    check_env(env, skip_render_check=True, skip_close_check=True)
    obs, info = env.reset(seed=0)
    assert (
        obs["state"].dtype == np.float32
        and obs["state"].shape == env.observation_space["state"].shape
    )
    # zero padding to the suite's largest state: only the tail past the task's size is zero
    size = info["state_size"]
    assert size <= obs["state"].shape[0] and np.count_nonzero(obs["state"][:size]) > size // 2
    assert np.all(obs["state"][size:] == 0)


def test_reset_restores_init_states_exactly(fresh: LiberoEnv) -> None:
    env, states = fresh, load_init_states(SUITE, TASK)
    env.num_settle_steps = 0
    for options, seed, expected in [({"init_state_id": 7}, None, 7), (None, 123, 123 % 50)]:
        _, info = env.reset(seed=seed, options=options)
        assert info["init_state_id"] == expected == env.init_state_id
        np.testing.assert_allclose(env.get_sim_state(), states[expected], rtol=0, atol=1e-12)
    # settle steps move the sim on, identically every time
    env.num_settle_steps = 10
    obs_a, _ = env.reset(options={"init_state_id": 7})
    sim_a = env.get_sim_state()
    obs_b, _ = env.reset(options={"init_state_id": 7})
    assert not np.allclose(sim_a, states[7])
    np.testing.assert_array_equal(obs_a["state"], obs_b["state"])
    with pytest.raises(ValueError, match="out of range"):
        env.reset(options={"init_state_id": 50})
    with pytest.raises(ValueError, match="reset option"):
        env.reset(options={"init_state": 1})


def test_language_instruction(env: LiberoEnv) -> None:
    _, info = env.reset(seed=1)
    text = get_task(SUITE, TASK).language
    assert info["language_instruction"] == env.language_instruction == text
    assert "black bowl" in text and "plate" in text


def test_truncation_at_horizon(fresh: LiberoEnv) -> None:
    env = fresh
    env.horizon = 3
    env.reset(seed=2)
    flags = [env.step(NOOP)[2:] for _ in range(3)]
    assert [(term, trunc, info["is_success"]) for term, trunc, info in flags] == [
        (False, False, False),
        (False, False, False),
        (False, True, False),
    ]


@pytest.mark.parametrize("reward_type", ["sparse", "dense"])
def test_success_terminates_and_rewards(fresh: LiberoEnv, reward_type: str) -> None:
    env = fresh
    env.reward_type = reward_type
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step(NOOP)
    assert not terminated and not info["is_success"]
    if reward_type == "sparse":
        assert reward == 0.0
    else:
        assert 0.0 < info["goal_potential"] < 0.5  # one unsatisfied predicate
    potential = info.get("goal_potential")
    place_bowl_on_plate(env)
    for _ in range(30):
        previous = potential
        _, reward, terminated, truncated, info = env.step(NOOP)
        potential = info.get("goal_potential")
        if terminated:
            break
    assert terminated and info["is_success"] and not truncated
    if reward_type == "sparse":
        assert reward == 1.0
    else:
        # success (1) plus the potential difference; the potential is 1 on success
        assert potential == 1.0 and previous < 1.0
        assert reward == pytest.approx(1.0 + potential - previous)
