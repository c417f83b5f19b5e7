"""LiberoEnv's lean step: the same trajectories as robosuite's full step, with less work."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("libero")

from pipelined_vec_env.libero.env import LiberoEnv  # noqa: E402

SUITE, TASK = "libero_object", 0
SUBSTEPS = 25  # robosuite's physics steps per 20 Hz control step (500 Hz simulation)


@pytest.fixture(params=["goal", "full"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[LiberoEnv, LiberoEnv]]:
    """A lean and a plain env of the same task and features."""
    lean = LiberoEnv(SUITE, TASK, state_features=request.param, reward_type="dense")
    plain = LiberoEnv(
        SUITE, TASK, state_features=request.param, reward_type="dense", lean_step=False
    )
    yield lean, plain
    lean.close()
    plain.close()


def _count_forwards(env: LiberoEnv) -> list[int]:
    """Count every ``MjSim.forward`` of ``env``'s simulator from now on (one counter)."""
    sim = env._sim_env.env.sim
    real, calls = sim.forward, [0]

    def forward() -> None:
        calls[0] += 1
        real()

    sim.forward = forward
    return calls


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(np.array_equal(a, b))


def test_lean_step_is_bit_identical(pair: tuple[LiberoEnv, LiberoEnv]) -> None:
    lean, plain = pair
    actions = np.random.default_rng(0).uniform(-1, 1, (80, 7))
    for episode, init_state_id in enumerate((3, 7)):
        obs_lean, info_lean = lean.reset(options={"init_state_id": init_state_id})
        obs_plain, info_plain = plain.reset(options={"init_state_id": init_state_id})
        assert _same(obs_lean, obs_plain) and info_lean == info_plain
        assert np.array_equal(lean.get_sim_state(), plain.get_sim_state())
        for action in actions[episode * 40 : (episode + 1) * 40]:
            out_lean, out_plain = lean.step(action), plain.step(action)
            assert _same(out_lean[0], out_plain[0])
            assert out_lean[1:] == out_plain[1:]  # reward, terminated, truncated, info
            assert np.array_equal(lean.get_sim_state(), plain.get_sim_state())


def test_lean_step_skips_the_redundant_forwards(pair: tuple[LiberoEnv, LiberoEnv]) -> None:
    lean, plain = pair
    for env in (lean, plain):
        env.reset(options={"init_state_id": 0})
    lean_calls, plain_calls = _count_forwards(lean), _count_forwards(plain)
    lean.step(np.zeros(7))
    plain.step(np.zeros(7))
    assert plain_calls[0] >= 2 * SUBSTEPS  # robosuite's loop and the controller's update
    # the controller's forwards are skipped, and the loop's at substeps 2-25 (split step)
    assert lean_calls[0] == plain_calls[0] - SUBSTEPS - (SUBSTEPS - 1)
    # with goal features the observation reads no robosuite observable: they are off
    raw_lean = lean._sim_env.env._get_observations(force_update=True)
    raw_plain = plain._sim_env.env._get_observations(force_update=True)
    assert "robot0_eef_pos" in raw_plain
    assert ("robot0_eef_pos" in raw_lean) == (lean.state_features != "goal")
