"""gymnasium's vector-env contract where `PipelinedVectorEnv` once differed from
`AsyncVectorEnv` (found by running gymnasium's own tests/vector, see docs/conformance.md)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

pytestmark = pytest.mark.timeout(60)


class ActionRecordingEnv(gym.Env):
    """Observation: a Box(0, 1, (1,)); keeps the last action it received (`last_action`)."""

    def __init__(self, action_space: spaces.Space) -> None:
        self.action_space = action_space
        self.observation_space = spaces.Box(0, 1, (1,), np.float32)
        self.last_action: Any = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any):
        self.last_action = action
        return np.zeros(1, np.float32), 0.0, False, False, {}


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
