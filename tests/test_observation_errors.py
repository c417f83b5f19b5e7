"""An observation that does not fit the space's layout names its env, innermost key and the
mismatch, carries the worker's traceback, and loses no other env's results (also those of
the same worker); dtypes are cast as gymnasium's shared memory writes cast them."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from pipelined_vec_env import ObservationError, RemoteTraceback
from pipelined_vec_env.workers.observation_check import find_mismatch

SPACE = spaces.Dict(
    {
        "agentview_image": spaces.Box(0, 255, (8, 8, 3), np.uint8),
        "wrist_image": spaces.Box(0, 255, (8, 8, 3), np.uint8),
        "state": spaces.Box(-np.inf, np.inf, (2,), np.float32),
    }
)


class FrameEnv(gym.Env):
    """Frames of value ``10 * env_id + t``; env ``bad_env`` returns one bad observation
    (``kind``) at its ``bad_at``-th step (``when="step"``) or reset (``when="reset"``)."""

    observation_space = SPACE
    action_space = spaces.Discrete(2)

    def __init__(
        self, env_id: int, bad_env: int = 4, kind: str = "rgba", when: str = "step", bad_at: int = 1
    ):
        self.env_id, self.t = env_id, 0
        self.calls = {"step": 0, "reset": 0}  # per kind: the calls so far
        self.bad_call = {"step": 0, "reset": 0, when: bad_at if env_id == bad_env else 0}
        self.kind = kind

    def _obs(self, when: str) -> dict[str, Any]:
        value = 10 * self.env_id + self.t
        obs: dict[str, Any] = {
            "agentview_image": np.full((8, 8, 3), value, np.uint8),
            "wrist_image": np.full((8, 8, 3), value + 1, np.uint8),
            "state": np.array([self.env_id, self.t], np.float32),
        }
        self.calls[when] += 1
        if self.calls[when] == self.bad_call[when]:
            if self.kind == "rgba":
                obs["wrist_image"] = np.zeros((8, 8, 4), np.uint8)
            elif self.kind == "missing":
                del obs["wrist_image"]
            elif self.kind == "float":  # cast, not refused
                obs["wrist_image"] = np.full((8, 8, 3), value + 1.75, np.float64)  # -> value + 1
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs("reset"), {"env": self.env_id}

    def step(self, action: Any):
        self.t += 1
        return self._obs("step"), float(self.env_id + self.t), False, False, {"t": self.t}


def _fns(**kwargs: Any) -> list[Any]:
    return [lambda i=i: FrameEnv(i, **kwargs) for i in range(6)]


@pytest.mark.parametrize("envs_per_worker", [1, 3])
def test_a_bad_frame_names_env_key_and_shapes_and_keeps_the_others(
    make_pipelined: Any, envs_per_worker: int
) -> None:
    envs = make_pipelined(_fns(), envs_per_worker=envs_per_worker)
    envs.reset(seed=0)
    with pytest.raises(ObservationError) as info:
        envs.step(np.zeros(6, np.int64))
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.env_index, err.key) == (4, "observation['wrist_image']")
    assert (err.expected, err.received) == ("shape (8, 8, 3) uint8", "shape (8, 8, 4) uint8")
    assert "env 4: observation['wrist_image']" in str(err)
    assert isinstance(err.__cause__, RemoteTraceback)
    # the worker's own traceback: the failed write into the shared row, numpy's words
    assert "_emit" in str(err.__cause__) and "shape" in str(err.__cause__)
    obs, rewards, terminations, truncations, infos = err.partial_results
    assert err.partial_mask.tolist() == [True, True, True, True, False, True]
    ok = [0, 1, 2, 3, 5]  # env 3 and 5 share env 4's worker when envs_per_worker=3
    np.testing.assert_array_equal(rewards[ok], [i + 1.0 for i in ok])
    assert rewards[4] == 0 and not terminations.any() and not truncations.any()
    assert infos["_t"].tolist() == err.partial_mask.tolist()
    for i in ok:
        assert (obs["agentview_image"][i] == 10 * i + 1).all()
        assert (obs["wrist_image"][i] == 10 * i + 2).all()
        assert obs["state"][i].tolist() == [i, 1]
    # reset recovers, and the stage steps again
    envs.reset(seed=0)
    obs, rewards, *_ = envs.step(np.zeros(6, np.int64))
    assert rewards.tolist() == [i + 1.0 for i in range(6)]
    assert [int(obs["wrist_image"][i, 0, 0, 0]) for i in range(6)] == [10 * i + 2 for i in range(6)]


def test_a_missing_key_at_reset_is_named_and_the_others_are_kept(make_pipelined: Any) -> None:
    envs = make_pipelined(_fns(kind="missing", when="reset"), envs_per_worker=3)
    with pytest.raises(ObservationError, match=r"env 4: observation\['wrist_image'\]") as info:
        envs.reset(seed=0)
    err = info.value
    assert err.received.startswith("no such key") and "agentview_image" in err.received
    assert err.partial_mask.tolist() == [True, True, True, True, False, True]
    obs, *_, infos = err.partial_results
    assert infos["env"][[0, 1, 2, 3, 5]].tolist() == [0, 1, 2, 3, 5]
    assert (obs["agentview_image"][5] == 50).all() and (obs["wrist_image"][3] == 31).all()
    obs, _ = envs.reset(seed=0)
    assert (obs["wrist_image"][4] == 41).all()


def test_float_frames_are_cast_into_a_uint8_space(make_pipelined: Any) -> None:
    """Cast as gymnasium's shared memory writes cast (``np.asarray(value, dtype)``, what
    ``AsyncVectorEnv`` does): 41.75 becomes 41. (``SyncVectorEnv`` refuses this cast:
    ``np.stack`` with ``same_kind`` casting raises TypeError.)"""
    envs = make_pipelined(_fns(kind="float"), envs_per_worker=3)
    envs.reset(seed=0)
    obs = envs.step(np.zeros(6, np.int64))[0]
    assert obs["wrist_image"].dtype == np.uint8
    assert [int(obs["wrist_image"][i, 0, 0, 0]) for i in range(6)] == [10 * i + 2 for i in range(6)]


def test_an_array_space_names_its_env_too(make_pipelined: Any) -> None:
    class Rgba(gym.Env):
        observation_space = spaces.Box(0, 255, (4, 4, 3), np.uint8)
        action_space = spaces.Discrete(2)

        def __init__(self, bad: bool) -> None:
            self.bad = bad

        def reset(self, *, seed=None, options=None):
            return np.zeros((4, 4, 4 if self.bad else 3), np.uint8), {}

        def step(self, action):
            return self.reset()[0], 1.0, False, False, {}

    envs = make_pipelined([lambda b=b: Rgba(b) for b in (False, True)], envs_per_worker=2)
    with pytest.raises(ObservationError, match=r"env 1: observation does not fit") as info:
        envs.reset(seed=0)
    assert info.value.partial_mask.tolist() == [True, False]


@pytest.mark.parametrize(
    ("space", "value", "found"),
    [
        (SPACE["state"], np.zeros(2, np.float64), None),
        (SPACE["state"], np.zeros(3), ("observation", "shape (2,) float32", "shape (3,) float64")),
        (SPACE["state"], "ab", ("observation", "shape (2,) float32", "shape () <U2")),
        (
            spaces.Tuple([SPACE["state"], spaces.Discrete(3)]),
            (np.zeros(2), np.zeros(2)),
            ("observation[1]", "shape () int64", "shape (2,) float64"),
        ),
        (
            SPACE,
            np.zeros(3),
            ("observation", f"a dict with keys {list(SPACE.spaces)}", "shape (3,) float64"),
        ),
    ],
)
def test_find_mismatch(space: spaces.Space, value: Any, found: Any) -> None:
    assert find_mismatch(space, value) == found


def _decoupled_round(envs: Any, ids: list[int], t: int) -> None:
    """Send every env of ``ids`` an action and receive all their results (step ``t``, none
    failing): each env's frame and reward are its own."""
    envs.send(np.zeros(len(ids), np.int64), ids)
    got: dict[int, tuple[int, float]] = {}
    while len(got) < len(ids):
        obs, rewards, *_, infos = envs.recv(timeout=30)
        for k, g in enumerate(infos["env_id"].tolist()):
            got[g] = (int(obs["wrist_image"][k, 0, 0, 0]), float(rewards[k]))
    assert got == {g: (10 * g + t + 1, g + float(t)) for g in ids}


@pytest.mark.parametrize(
    ("envs_per_worker", "order", "recovery"),
    [(3, "in order", "async_reset"), (3, "reversed", "reset"), (1, "in order", "reset")],
)
def test_decoupled_recv_names_the_bad_frame_and_keeps_its_worker_siblings(
    make_pipelined: Any, envs_per_worker: int, order: str, recovery: str
) -> None:
    """EnvPool-style ``recv``: env 4's RGBA frame at its 2nd step raises `ObservationError`
    naming it once; the results of the other envs, those of env 4's worker included, come
    out of the ``recv`` calls around it, those envs go on with ``send``, and a reset of
    every env brings env 4 back. Whole workers' steps sent in order take the slot lane;
    reversed, the general path."""
    envs = make_pipelined(_fns(bad_at=2), envs_per_worker=envs_per_worker)
    envs.async_reset(seed=0)
    envs.recv(batch_size=6, timeout=30)
    ids = list(range(6)) if order == "in order" else list(range(5, -1, -1))
    _decoupled_round(envs, ids, 1)
    envs.send(np.zeros(6, np.int64), ids)  # env 4's second step is the bad one
    got: dict[int, tuple[int, float]] = {}
    errors = []
    while len(got) < 5 or not errors:  # the error may come before, among or after them
        try:
            obs, rewards, *_, infos = envs.recv(timeout=30)
        except ObservationError as err:
            errors.append(err)
            continue
        for k, g in enumerate(infos["env_id"].tolist()):
            got[g] = (int(obs["wrist_image"][k, 0, 0, 0]), float(rewards[k]))
    assert len(errors) == 1
    err = errors[0]
    assert (err.env_index, err.key, err.env_indices) == (4, "observation['wrist_image']", (4,))
    assert (err.expected, err.received) == ("shape (8, 8, 3) uint8", "shape (8, 8, 4) uint8")
    assert isinstance(err.__cause__, RemoteTraceback) and "_emit" in str(err.__cause__)
    # every other env's second step, env 4's worker siblings (3 and 5 with 3 per worker) too
    assert got == {g: (10 * g + 3, g + 2.0) for g in (0, 1, 2, 3, 5)}
    with pytest.raises(ValueError, match="not received"):
        envs.send(np.zeros(1, np.int64), [4])  # env 4 left the decoupled flow
    _decoupled_round(envs, [g for g in ids if g != 4], 3)  # the others go on
    if recovery == "async_reset":
        envs.async_reset(seed=0)
        envs.recv(batch_size=6, timeout=30)
        _decoupled_round(envs, ids, 1)
    else:
        envs.reset(seed=0)
        obs, rewards, *_ = envs.step(np.zeros(6, np.int64))
        assert rewards.tolist() == [g + 1.0 for g in range(6)]
        assert [int(obs["wrist_image"][g, 0, 0, 0]) for g in range(6)] == [
            10 * g + 2 for g in range(6)
        ]


def test_decoupled_reset_with_a_missing_key_keeps_its_worker_siblings(
    make_pipelined: Any,
) -> None:
    envs = make_pipelined(_fns(kind="missing", when="reset"), envs_per_worker=3)
    envs.async_reset(seed=0)
    got: dict[int, int] = {}
    errors = []
    while len(got) < 5 or not errors:
        try:
            obs, rewards, *_, infos = envs.recv(timeout=30)
        except ObservationError as err:
            errors.append(err)
            continue
        assert not rewards.any()
        for k, g in enumerate(infos["env_id"].tolist()):
            assert infos["env"][k] == g
            got[g] = int(obs["wrist_image"][k, 0, 0, 0])
    assert [(e.env_index, e.key) for e in errors] == [(4, "observation['wrist_image']")]
    assert got == {g: 10 * g + 1 for g in (0, 1, 2, 3, 5)}
    envs.async_reset(seed=0)  # env 4's second reset fits
    obs, *_, infos = envs.recv(batch_size=6, timeout=30)
    assert sorted(infos["env_id"].tolist()) == list(range(6))
    assert int(obs["wrist_image"][infos["env_id"].tolist().index(4), 0, 0, 0]) == 41
