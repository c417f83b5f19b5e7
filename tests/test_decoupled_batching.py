"""Decoupled recv batches its results per answer: the batch equals an env-by-env merge.

`recv` keeps each answer's results together and joins them once (the info columns of
fast step answers with one copy per key); `send` sends a run of one worker's envs as one
slice. These tests drive random subsets and orders through the public API and compare
every ``recv`` with the batch built env by env from what each env returned.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from pipelined_vec_env.debug_envs import FaultyEnv
from pipelined_vec_env.infos import merge_info
from pipelined_vec_env.workers.slots import ColumnInfos, InfoLayout, join_column_infos
from tests.conftest import assert_tree_equal

pytestmark = pytest.mark.timeout(120)


class InfoEnv(gym.Env):
    """Observation float32 ``(2,)``: (own id, steps taken); reward: the action plus 100 x
    the id; scalar infos every step (the fast path's info columns), the same keys at
    reset (`info_at`); terminates every ``episode`` steps. Its step naps up to 3 ms (its
    worker measures it off the CPU and steps its envs concurrently) unless ``serial``
    declares it serial (``metadata["step_concurrency"]``)."""

    def __init__(
        self,
        env_id: int,
        floats_only: bool = False,
        episode: int = 7,
        extra_every: int = 0,
        serial: bool = False,
    ) -> None:
        if serial:
            self.metadata = {**self.metadata, "step_concurrency": "serial"}
        self.env_id, self.episode, self.steps = env_id, episode, 0
        self.floats_only, self.extra_every = floats_only, extra_every
        self.observation_space = spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Box(-1e6, 1e6, shape=(), dtype=np.float32)
        self.rng = np.random.default_rng(env_id)

    def info(self) -> dict[str, Any]:
        return info_at(self.steps, self.floats_only, self.extra_every)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.steps = 0
        return np.array([self.env_id, 0], dtype=np.float32), self.info()

    def step(self, action: Any):
        if action == RAISE:
            raise ValueError(f"env {self.env_id} was told to fail")
        time.sleep(self.rng.uniform(0, 0.003))
        self.steps += 1
        obs = np.array([self.env_id, self.steps], dtype=np.float32)
        reward = float(action) + 100.0 * self.env_id
        return obs, reward, self.steps % self.episode == 0, False, self.info()


RAISE = -1.0  # the action that makes `InfoEnv.step` raise


def info_at(t: int, floats_only: bool, extra_every: int = 0) -> dict[str, Any]:
    """The info after ``t`` steps: floats only (one kind of cell: the joined path), or an
    int, a float and a bool (mixed cells: merged per answer); with ``extra_every``, one
    more key every that many steps (infos off the worker's layout: pickled beside the
    slot's results)."""
    if floats_only:
        info: dict[str, Any] = {"half": t / 2, "neg": -1.0 * t}
    else:
        info = {"t": t, "half": t / 2, "even": t % 2 == 0}
    if extra_every and t % extra_every == 0:
        info["extra"] = 10.0 * t
    return info


def _expected(
    ids: np.ndarray,
    steps: dict[int, int],
    actions: dict[int, float],
    floats_only: bool,
    extra_every: int = 0,
) -> tuple:
    """The batch of ``ids`` built env by env: what each env returned at its step count."""
    n = len(ids)
    obs = np.array([[g, steps[g]] for g in ids.tolist()], dtype=np.float32)
    rewards = np.array(
        [0.0 if steps[g] == 0 else actions[g] + 100.0 * g for g in ids.tolist()],
        dtype=np.float64,
    )
    terms = np.array([steps[g] > 0 and steps[g] % 7 == 0 for g in ids.tolist()], dtype=np.bool_)
    infos: dict[str, Any] = {}
    for k, g in enumerate(ids.tolist()):
        infos = merge_info(infos, info_at(steps[g], floats_only, extra_every), k, n)
    infos["env_id"] = ids
    infos["_env_id"] = np.ones(n, dtype=np.bool_)
    return obs, rewards, terms, np.zeros(n, dtype=np.bool_), infos


@pytest.mark.parametrize("floats_only", [True, False])
@pytest.mark.parametrize("fast_path", [True, False])
def test_recv_equals_the_env_by_env_batch(make_pipelined, fast_path, floats_only):
    n = 6
    envs = make_pipelined(
        [partial(InfoEnv, i, floats_only) for i in range(n)],
        envs_per_worker=3,
        fast_path=fast_path,
    )
    envs.async_reset(seed=0)
    steps = dict.fromkeys(range(n), 0)
    last: dict[int, float] = {}
    rng = np.random.default_rng(1)
    seen_joined = 0
    for _ in range(80):
        obs, rewards, terms, truncs, infos = envs.recv(batch_size=int(rng.integers(1, 4)))
        ids = infos["env_id"]
        seen_joined += len(ids) > 3  # results of both workers in one recv
        want = _expected(ids, steps, last, floats_only)
        got = (obs, rewards, terms, truncs, infos)
        assert_tree_equal(got, want)
        # send in a random order, in one or two calls: runs of one worker and scattered ids
        order = rng.permutation(len(ids))
        cut = int(rng.integers(1, len(ids) + 1))
        for part in (order[:cut], order[cut:]):
            if len(part) == 0:
                continue
            actions = rng.integers(0, 50, size=len(part)).astype(np.float32)
            envs.send(actions, ids[part])
            for g, a in zip(ids[part].tolist(), actions.tolist(), strict=True):
                # NEXT_STEP autoreset: the step after a termination is the reset
                ended = steps[g] > 0 and steps[g] % 7 == 0
                steps[g] = 0 if ended else steps[g] + 1
                last[g] = a
    assert seen_joined > 0  # some recv joined the answers of several workers


def _advance(steps: dict[int, int], last: dict[int, float], ids: list[int], actions) -> None:
    """Count one step of the envs ``ids`` (NEXT_STEP autoreset: the step after a
    termination is the reset)."""
    for g, a in zip(ids, actions.tolist(), strict=True):
        ended = steps[g] > 0 and steps[g] % 7 == 0
        steps[g] = 0 if ended else steps[g] + 1
        last[g] = a


@pytest.mark.parametrize("extra_every", [0, 5])
@pytest.mark.parametrize("floats_only", [True, False])
def test_whole_worker_recv_equals_the_env_by_env_batch(
    make_pipelined, lane_joins, floats_only, extra_every
):
    """Sends of whole workers, each worker's envs in order, go through the slot lane
    (results joined straight from the slots); what ``recv`` returns is still the batch
    built env by env, also when the infos leave the worker's layout (pickled beside the
    slot's results) or mix cell kinds (merged key by key). The envs say they step
    serially: a worker stepping concurrently gets one command per env instead."""
    n = 6
    envs = make_pipelined(
        [partial(InfoEnv, i, floats_only, extra_every=extra_every, serial=True) for i in range(n)],
        envs_per_worker=3,
    )
    envs.async_reset(seed=0)
    steps = dict.fromkeys(range(n), 0)
    last: dict[int, float] = {}
    rng = np.random.default_rng(2)
    for _ in range(60):
        obs, rewards, terms, truncs, infos = envs.recv(batch_size=3)
        ids = infos["env_id"]
        want = _expected(ids, steps, last, floats_only, extra_every)
        assert_tree_equal((obs, rewards, terms, truncs, infos), want)
        order = np.argsort(ids, kind="stable")  # each worker's envs in order
        actions = rng.integers(0, 50, size=len(ids)).astype(np.float32)
        envs.send(actions, ids[order])
        _advance(steps, last, ids[order].tolist(), actions)
    if floats_only and not extra_every:
        assert lane_joins.joined > 30  # the lane served most calls
    elif not floats_only:
        assert lane_joins.joined == 0  # mixed cells: joined key by key


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_a_failing_env_in_a_whole_worker_send_keeps_the_other_results(make_pipelined, max_restarts):
    """An env that raises in a whole-worker step: with no restarts allowed its error comes
    from ``recv`` and the other worker's results come from the next ``recv``; with one, its
    worker is rebuilt and its envs come back truncated, flagged ``worker_restarted``."""
    envs = make_pipelined(
        [partial(InfoEnv, i, True) for i in range(4)], envs_per_worker=2, max_restarts=max_restarts
    )
    envs.async_reset(seed=0)
    got = 0
    while got < 4:
        got += len(envs.recv(batch_size=1, timeout=30)[-1]["env_id"])
    envs.send(np.array([1.0, 2.0, 3.0, RAISE], dtype=np.float32), np.arange(4))
    time.sleep(0.5)  # both answers are in before the recv: it takes them together
    results: dict[int, tuple[float, bool]] = {}
    if max_restarts == 0:
        with pytest.raises(ValueError, match="env 3 was told to fail"):
            envs.recv(batch_size=4, timeout=30)
        _, rewards, _, truncs, infos = envs.recv(timeout=30)
        assert infos["env_id"].tolist() == [0, 1]
        np.testing.assert_array_equal(rewards, [1.0, 102.0])
        return
    while len(results) < 4:
        _, rewards, _, truncs, infos = envs.recv(timeout=30)
        for k, g in enumerate(infos["env_id"].tolist()):
            results[g] = (float(rewards[k]), bool(truncs[k]))
            restarted = infos.get("worker_restarted", np.zeros(len(rewards), bool))[k]
            assert bool(restarted) == (g >= 2)
    assert results == {0: (1.0, False), 1: (102.0, False), 2: (0.0, True), 3: (0.0, True)}


@pytest.mark.parametrize("step_seconds,quick", [(0.0, True), (0.005, False)], ids=["0ms", "5ms"])
def test_send_hands_the_core_over_only_while_steps_are_quick(
    make_pipelined, monkeypatch, step_seconds, quick
):
    """A whole-worker ``send`` hands the caller's core to the workers while the time from
    such a send to the ``recv`` that returns its answers stays under
    ``HAND_OVER_SECONDS`` (1 ms); envs of 5 ms stop it after the first round trip."""
    from pipelined_vec_env.stepping import decoupled

    handed = 0

    def counted(profiler: object = None) -> None:
        nonlocal handed
        handed += 1

    monkeypatch.setattr(decoupled, "hand_over_core", counted)
    envs = make_pipelined([partial(FaultyEnv, sleep_seconds=step_seconds)] * 2, envs_per_worker=1)
    envs.async_reset(seed=0)
    for count in range(40):
        if count:
            envs.send(np.full(2, FaultyEnv.SLEEP), [0, 1])
        assert len(envs.recv(batch_size=2, timeout=30)[-1]["env_id"]) == 2
    if quick:
        assert handed >= 10  # most of the 39 sends (a loaded host may slow some)
    else:
        assert handed <= 2  # the first send's, before any round trip was measured


class SlowEnv(gym.Env):
    """Steps of ``seconds`` (slept) with an int and a float info (cells of two kinds: the
    lane files them key by key instead of joining them from the slots)."""

    observation_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
    action_space = spaces.Box(-1.0, 1.0, shape=(), dtype=np.float32)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action: Any):
        time.sleep(self.seconds)
        return np.zeros(1, dtype=np.float32), 0.0, False, False, {"t": 1, "x": 0.5}


@pytest.mark.parametrize("workers,batch", [(2, 2), (8, 1)], ids=["mixed-infos", "8-in-flight"])
def test_slow_steps_stop_the_hand_over_whatever_their_answers(
    make_pipelined, monkeypatch, workers, batch
):
    """Steps of 8 ms stop the hand-over once their round trips come in (the resets' quick
    answers may allow it for the first sends), also where the answers are filed key by
    key (infos of two cell kinds) and where many workers are in flight and each ``recv``
    takes one (the answer's own send counts, not the latest)."""
    from pipelined_vec_env.stepping import decoupled

    handed = 0

    def counted(profiler: object = None) -> None:
        nonlocal handed
        handed += 1

    monkeypatch.setattr(decoupled, "hand_over_core", counted)
    envs = make_pipelined([partial(SlowEnv, 0.008)] * workers, envs_per_worker=1)
    envs.async_reset(seed=0)
    for sends in range(1, 41):
        ids = envs.recv(batch_size=batch, timeout=30)[-1]["env_id"]
        envs.send(np.zeros(len(ids), dtype=np.float32), np.sort(ids))
        if sends == 10:  # the resets' quick answers are behind: steps' round trips now
            handed = 0
    assert handed <= 1, f"{handed} of the last 30 sends handed the core over"


def test_send_keeps_actions_when_the_caller_reuses_its_array(make_pipelined):
    """The actions of a run of rows are sent as a copy: changing the caller's array after
    ``send`` does not change what the envs execute."""
    envs = make_pipelined([partial(InfoEnv, i) for i in range(4)], envs_per_worker=2)
    envs.async_reset(seed=0)
    got = 0
    while got < 4:
        got += len(envs.recv(batch_size=1)[-1]["env_id"])
    actions = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    envs.send(actions, np.arange(4))
    actions[:] = -1000.0
    rewards = np.zeros(4)
    got = 0
    while got < 4:
        _, r, _, _, info = envs.recv(batch_size=1)
        rewards[info["env_id"]] = r
        got += len(r)
    np.testing.assert_array_equal(rewards, [1.0, 102.0, 203.0, 304.0])


def _columns(layout: InfoLayout, rows: list[dict[str, Any]]) -> ColumnInfos:
    kind = layout.cell_dtype
    block = np.array([[row[key] for row in rows] for key in layout.keys], dtype=kind)
    return ColumnInfos(layout, None, len(rows), block)


def test_join_column_infos_equals_merging_env_by_env():
    float_layout = InfoLayout.learn([[{"a": 1.5, "b": 2.5}]])
    assert float_layout is not None and float_layout.cell_dtype is not None
    rows = [{"a": 0.5 * k, "b": -1.0 * k} for k in range(5)]
    parts = [_columns(float_layout, rows[:2]), _columns(float_layout, rows[2:])]
    joined = join_column_infos(parts)
    expected: dict[str, Any] = {}
    for k, row in enumerate(rows):
        expected = merge_info(expected, row, k, len(rows))
    assert joined is not None
    assert_tree_equal(joined, expected)
    assert list(joined) == list(expected)  # gymnasium's key order: each key, then its mask


def test_join_column_infos_declines_what_it_cannot_join():
    one = InfoLayout.learn([[{"a": 1.5}]])
    other = InfoLayout.learn([[{"b": 1.5}]])
    assert one is not None and other is not None
    a = _columns(one, [{"a": 1.0}])
    b = _columns(other, [{"b": 2.0}])
    assert join_column_infos([a, b]) is None  # two layouts: merged one by one instead
    empty = ColumnInfos(None, [], 2)
    assert join_column_infos([empty, empty]) == {}
    assert join_column_infos([empty, a]) is None
