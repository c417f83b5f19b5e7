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
