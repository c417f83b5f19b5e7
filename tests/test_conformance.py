"""gymnasium's vector-env contract where `PipelinedVectorEnv` once differed from
`AsyncVectorEnv` (found by running gymnasium's own tests/vector, see docs/conformance.md)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from tests.conftest import ActionRecordingEnv

pytestmark = pytest.mark.timeout(60)


def _graph() -> spaces.Graph:
    return spaces.Graph(node_space=spaces.Box(-1, 1, (2,)), edge_space=spaces.Discrete(3))


@pytest.mark.parametrize(
    "space",
    [
        _graph(),
        spaces.Tuple((_graph(), spaces.Discrete(2))),
        spaces.Dict(g=_graph(), d=spaces.Discrete(2)),
        spaces.Sequence(_graph()),
    ],
    ids=["Graph", "Tuple(Graph)", "Dict(Graph)", "Sequence(Graph)"],
)
@pytest.mark.parametrize("shared_memory", [True, False])
def test_graph_actions_reach_the_env(make_pipelined, space, shared_memory):
    envs = make_pipelined(
        [lambda: ActionRecordingEnv(space) for _ in range(2)], shared_memory=shared_memory
    )
    envs.reset(seed=0)
    envs.action_space.seed(0)
    actions = envs.action_space.sample()
    envs.step(actions)  # raised "not in the action space": GraphInstance became a tuple
    received = envs.get_attr("last_action")
    for i, action in enumerate(received):
        assert envs.single_action_space.contains(action), (i, action)


def test_np_random_seed_and_np_random_are_per_env(make_pipelined):
    envs = make_pipelined([lambda: gym.make("CartPole-v1") for _ in range(4)], num_stages=2)
    envs.reset(seed=42)
    assert envs.np_random_seed == (42, 43, 44, 45)
    envs.reset()  # seed=None keeps the seeds
    assert envs.np_random_seed == (42, 43, 44, 45)
    generators = envs.np_random
    assert isinstance(generators, tuple) and len(generators) == 4
    assert all(isinstance(g, np.random.Generator) for g in generators)
    expected = gym.make("CartPole-v1")
    expected.reset(seed=44)
    expected.reset()  # the same two resets as env 2
    assert generators[2].bit_generator.state == expected.unwrapped.np_random.bit_generator.state


def test_a_closed_env_raises_closed_environment_error(make_pipelined):
    envs = make_pipelined([lambda: gym.make("CartPole-v1") for _ in range(2)])
    envs.close()
    for use in (
        lambda: envs.reset(),
        lambda: envs.step(np.zeros(2, np.int64)),
        lambda: envs.step_async(np.zeros(2, np.int64)),
        lambda: envs.call("render"),
        lambda: envs.get_attr("spec"),
        lambda: envs.set_attr("x", 1),
        lambda: envs.async_reset(),
    ):
        with pytest.raises(gym.error.ClosedEnvironmentError):
            use()


def test_the_env_receives_the_callers_action_dtype_and_values(make_pipelined):
    space = spaces.Box(0, 1, (2,), np.float32)
    envs = make_pipelined([lambda: ActionRecordingEnv(space) for _ in range(2)])
    envs.reset(seed=0)
    actions = np.array([[0.1, 0.2], [0.3, 0.4]], dtype=np.float64)
    envs.step(actions)
    received = envs.get_attr("last_action")
    for i in range(2):  # was float32 [0.1, 0.2] (cast to the space's dtype)
        assert received[i].dtype == np.float64
        np.testing.assert_array_equal(received[i], actions[i])
    envs.step(np.array([3, 1], dtype=np.int64).reshape(2, 1).repeat(2, axis=1))
    assert envs.get_attr("last_action")[0].dtype == np.int64


@pytest.mark.parametrize(
    "space",
    [spaces.Discrete(2), spaces.Box(0, 1, (2,)), spaces.Dict(a=spaces.Discrete(2))],
    ids=["Discrete", "Box", "Dict"],
)
def test_a_scalar_action_raises_type_error(make_pipelined, space):
    envs = make_pipelined([lambda: ActionRecordingEnv(space) for _ in range(4)], num_stages=2)
    envs.reset(seed=0)
    with pytest.raises(TypeError, match="actions: expected a batch of 4 actions|dict of batches"):
        envs.step(0)  # was ValueError; gymnasium's vector envs raise TypeError
    envs.step(envs.action_space.sample())  # no env moved: the next step works


class StrictSpace(gym.Space):
    """A user space whose `contains` raises TypeError on a string (as `0 <= "a"` does)."""

    def contains(self, x: Any) -> bool:
        return 0 <= x <= 10

    def sample(self, mask: Any = None, probability: Any = None) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StrictSpace)


def test_a_user_space_whose_contains_raises_is_named(make_pipelined):
    envs = make_pipelined([lambda: ActionRecordingEnv(StrictSpace()) for _ in range(2)])
    envs.reset(seed=0)
    with pytest.raises(TypeError, match=r"actions\[1\]='a': StrictSpace.contains raised") as info:
        envs.step((1, "a"))
    assert isinstance(info.value.__cause__, TypeError)
    envs.step((1, 2))
    assert envs.get_attr("last_action") == (1, 2)


class ReusingEnv(gym.Env):
    """Returns the same observation array and info dict on every call, rewritten in place
    (as some simulators do); episodes end after 2 steps."""

    observation_space = spaces.Box(-10, 10, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.obs = np.zeros(2, np.float32)
        self.info: dict[str, Any] = {}
        self.t = 0

    def _out(self) -> tuple[np.ndarray, dict[str, Any]]:
        self.obs[:] = (self.t, -self.t)
        self.info.clear()
        self.info["t"] = self.t
        return self.obs, self.info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._out()

    def step(self, action: Any):
        self.t += 1
        obs, info = self._out()
        return obs, 1.0, self.t >= 2, False, info


@pytest.mark.parametrize("shared_memory", [True, False])
def test_same_step_final_values_survive_an_env_that_reuses_its_objects(
    make_pipelined, shared_memory
):
    mode = gym.vector.AutoresetMode.SAME_STEP
    envs = make_pipelined([ReusingEnv] * 2, autoreset_mode=mode, shared_memory=shared_memory)
    obs, info = envs.reset(seed=0)
    np.testing.assert_array_equal(obs, [[0, 0], [0, 0]])
    obs, _, term, _, info = envs.step(np.zeros(2, np.int64))  # t=1
    np.testing.assert_array_equal(obs, [[1, -1], [1, -1]])
    assert "final_obs" not in info and list(info["t"]) == [1, 1]
    obs, _, term, _, info = envs.step(np.zeros(2, np.int64))  # t=2: ends, resets to t=0
    assert list(term) == [True, True]
    np.testing.assert_array_equal(obs, [[0, 0], [0, 0]])
    for i in range(2):  # was [0, 0] and t=0: the reset had rewritten the env's objects
        np.testing.assert_array_equal(info["final_obs"][i], [2, -2])
    assert list(info["final_info"]["t"]) == [2, 2] and list(info["t"]) == [0, 0]
    obs, _, term, _, info = envs.step(np.zeros(2, np.int64))  # the next episode goes on
    np.testing.assert_array_equal(obs, [[1, -1], [1, -1]])
    assert "final_obs" not in info


def test_info_layout_per_env_returns_each_envs_dict_as_written(make_pipelined):
    mode = gym.vector.AutoresetMode.SAME_STEP
    envs = make_pipelined(
        [ReusingEnv] * 3, num_stages=2, autoreset_mode=mode, info_layout="per_env"
    )
    _, infos = envs.reset(seed=0)
    assert infos == [{"t": 0}, {"t": 0}, {"t": 0}]
    _, _, _, _, infos = envs.step(np.zeros(3, np.int64))
    assert infos == [{"t": 1}, {"t": 1}, {"t": 1}]
    envs.step_async(np.zeros(1, np.int64), stage=1)  # stage 1 holds env 2 only
    _, _, term, _, infos = envs.step_wait(stage=1)
    assert list(term) == [True] and len(infos) == 1
    assert infos[0]["t"] == 0 and infos[0]["final_info"] == {"t": 2}
    np.testing.assert_array_equal(infos[0]["final_obs"], [2, -2])
    with pytest.raises(ValueError, match="info_layout"):
        make_pipelined([ReusingEnv], info_layout="list")
