"""The step fast path (shared-memory slots, docs/wire_format.md): used where it should be,
and what comes back is exactly what the pickled path and gymnasium's SyncVectorEnv give.

Which path a step took is read from each worker's public `WireStats` (``envs.stages[s]
.workers[i].wire``); nothing here measures time.
"""

from __future__ import annotations

import copy
import os
import pickle
import select
import socket
import threading
import time
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from pipelined_vec_env import PipelinedVectorEnv, spinning
from pipelined_vec_env.debug_envs import CountingEnv, FaultyEnv
from pipelined_vec_env.errors import WorkerCrashedError
from pipelined_vec_env.workers.slots import WAKE_STEP_TIMED, ColumnInfos, InfoLayout, StepSlot
from pipelined_vec_env.workers.worker import spin_for_message
from tests.conftest import assert_tree_equal, slice_infos

NUM_ENVS = 4
#: Rounds a spin test runs until its spin shows (a load spike can hold it off a while)
SPIN_TRIES = 3
LENGTHS = [3, 5, 4, 7]

ACTION_SPACES = {
    "box": spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
    "box_int": spaces.Box(0, 9, shape=(2, 2), dtype=np.int16),
    "discrete": spaces.Discrete(5, start=-2),
    "multidiscrete": spaces.MultiDiscrete([3, 4]),
    "multibinary": spaces.MultiBinary(3),
}


class WireEnv(gym.Env):
    """Reward from the action (so actions must arrive intact), episodes of ``length``
    steps, and infos of one of several kinds:

    - ``none``: always empty;
    - ``scalars``: the same scalar keys every step, of several types;
    - ``floats``, ``ints``, ``bools``: the same keys every step, all of one type;
    - ``float_dtypes``, ``int_dtypes``: cells of one kind, keys of several dtypes
      (HalfCheetah's infos: float64 and float32);
    - ``changing``: keys and types that change from step to step;
    - ``mixed``: scalars plus an array and a nested dict (no column layout);
    - ``dtype``: the action's type and dtype as the env received it (a str).
    """

    def __init__(self, env_id: int, length: int, action: str, infos: str, obs: str = "box") -> None:
        self.env_id, self.length, self.infos = env_id, length, infos
        self.action_space = ACTION_SPACES[action]
        self.obs_kind = obs
        box = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
        self.observation_space = (
            box if obs == "box" else spaces.Dict({"x": box, "n": spaces.Discrete(100)})
        )
        self.count = 0

    def _obs(self, value: float) -> Any:
        x = np.array([self.env_id, value], dtype=np.float64)
        return x if self.obs_kind == "box" else {"x": x, "n": self.count % 100}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._obs(float(self.np_random.uniform())), {"reset_id": self.env_id}

    def step(self, action):
        self.count += 1
        value = float(np.sum(np.asarray(action, dtype=np.float64)))
        done = self.count >= self.length
        return (
            self._obs(value),
            value + self.env_id,
            done and self.env_id % 2 == 0,
            done and self.env_id % 2 == 1,
            self._info(action),
        )

    def _info(self, action: Any) -> dict[str, Any]:
        c = self.count
        if self.infos == "none":
            return {}
        if self.infos == "scalars":
            return {
                "f": 0.5 * c,
                "f32": np.float32(c / 3),
                "i": c * 1000,
                "i64": np.int64(-c),
                "b": c % 2 == 0,
            }
        if self.infos == "floats":  # one dtype for every key: merged in one store
            return {"x": 0.5 * c, "y": -c / 7, "id": float(self.env_id)}
        if self.infos == "ints":
            return {"n": c * 1000, "m": -c}
        if self.infos == "float_dtypes":
            return {"x": np.float64(c / 7), "f": 0.5 * c, "ctrl": np.float32(-c / 3)}
        if self.infos == "int_dtypes":
            return {"n": c * 1000, "i32": np.int32(-c), "u8": np.uint8(c % 256), "even": c % 2 == 0}
        if self.infos == "bools":
            return {"even": c % 2 == 0, "late": c > 2}
        if self.infos == "changing":
            if c % 3 == 0:
                return {"f": float(c)}
            if c % 3 == 1:
                return {"f": c, "extra": 1.5}  # same key, another type
            return {"extra": 2.5, "f": 0.25}  # same keys, another order
        if self.infos == "mixed":
            # np.bool_ is no np.number: gymnasium batches it as objects (no column either)
            return {"f": float(c), "arr": np.arange(3) * c, "sub": {"g": c}, "nb": np.bool_(c % 2)}
        assert self.infos == "dtype"
        return {"got": f"{type(action).__name__}:{np.asarray(action).dtype}"}


def wire_fns(action: str, infos: str, obs: str = "box") -> list:
    return [partial(WireEnv, i, LENGTHS[i], action, infos, obs) for i in range(NUM_ENVS)]


def draw(space: spaces.Space, rng: np.random.Generator, n: int = NUM_ENVS) -> np.ndarray:
    space.seed(int(rng.integers(1 << 30)))
    return np.stack([space.sample() for _ in range(n)])


def workers(envs: PipelinedVectorEnv) -> list[Any]:
    """The worker handles, through the public stages."""
    return [w for stage in envs.stages for w in stage.workers]


def fast_steps(envs: PipelinedVectorEnv) -> int:
    return sum(w.wire.fast_steps for w in workers(envs))


def pickled_steps(envs: PipelinedVectorEnv) -> int:
    return sum(w.wire.pickled_steps for w in workers(envs))


def assert_same_step(got: tuple, want: tuple) -> None:
    assert_tree_equal(got, want)
    assert list(got[4]) == list(want[4]), "info keys in another order"
    for key, value in want[4].items():
        if isinstance(value, np.ndarray):
            assert got[4][key].dtype == value.dtype, key


def assert_steps_match_sync(fns: list, got: list, batches: list, seed: int) -> None:
    """``got`` (a reset with ``seed``, then one step per batch of ``batches``) equals
    what SyncVectorEnv of ``fns`` returns for the same calls."""
    ref = gym.vector.SyncVectorEnv(fns)
    try:
        assert_tree_equal(got[0], ref.reset(seed=seed))
        for result, actions in zip(got[1:], batches, strict=True):
            assert_same_step(result, ref.step(actions))
    finally:
        ref.close()


def run_against_sync(make_pipelined, fns: list, steps: int = 16, **kwargs: Any) -> Any:
    """Step ours with the fast path, ours pickled and SyncVectorEnv on the same actions;
    every result must be equal. Returns the fast-path env."""
    mode = kwargs.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    fast = make_pipelined(fns, envs_per_worker=2, **kwargs)
    pickled = make_pipelined(fns, envs_per_worker=2, fast_path=False, **kwargs)
    ref = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        want = ref.reset(seed=5)
        assert_tree_equal(fast.reset(seed=5), want)
        assert_tree_equal(pickled.reset(seed=5), want)
        rng = np.random.default_rng(1)
        for _ in range(steps):
            actions = draw(ref.single_action_space, rng)
            want = ref.step(actions)
            assert_same_step(fast.step(actions), want)
            assert_same_step(pickled.step(actions), want)
            if mode == AutoresetMode.DISABLED:
                done = np.logical_or(want[2], want[3])
                if done.any():
                    want = ref.reset(options={"reset_mask": done})
                    assert_tree_equal(fast.reset(options={"reset_mask": done}), want)
                    assert_tree_equal(pickled.reset(options={"reset_mask": done}), want)
    finally:
        ref.close()
    assert pickled_steps(pickled) == steps * len(workers(pickled))
    assert fast_steps(pickled) == 0
    return fast


@pytest.mark.parametrize("action", sorted(ACTION_SPACES))
def test_array_actions_take_the_fast_path_and_match_sync(make_pipelined, action):
    fast = run_against_sync(make_pipelined, wire_fns(action, "scalars"))
    assert fast_steps(fast) == 16 * len(workers(fast)) and pickled_steps(fast) == 0
    # the scalar infos came back as slot columns, pickled only when a layout was learnt
    assert sum(w.wire.fast_answers for w in workers(fast)) > 0


@pytest.mark.parametrize(
    "infos",
    [
        "none",
        "scalars",
        "floats",
        "ints",
        "bools",
        "float_dtypes",
        "int_dtypes",
        "changing",
        "mixed",
    ],
)
def test_infos_present_absent_and_changing_match_sync(make_pipelined, infos):
    fast = run_against_sync(make_pipelined, wire_fns("box", infos), steps=20)
    assert pickled_steps(fast) == 0
    answers = [w.wire for w in workers(fast)]
    assert all(a.fast_answers + a.info_answers == 20 for a in answers)
    if infos == "none":  # infos pickled only for the autoreset steps (their reset infos)
        assert all(a.fast_answers >= 12 for a in answers)
    if infos == "mixed":  # no column layout: every answer pickles its infos
        assert all(a.info_answers == 20 for a in answers)


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("obs", ["box", "dict"])
def test_autoreset_modes_and_dict_observations_match_sync(make_pipelined, mode, obs):
    fast = run_against_sync(
        make_pipelined, wire_fns("multidiscrete", "scalars", obs), autoreset_mode=mode
    )
    assert pickled_steps(fast) == 0


@pytest.mark.parametrize("kind", ["dict", "sequence"])
def test_observations_without_a_flat_layout_still_match_sync(make_pipelined, kind):
    # "sequence" has no shared memory: the fast request is answered by a pickled message
    fns = [partial(CountingEnv, i, LENGTHS[i], kind) for i in range(NUM_ENVS)]
    fast = run_against_sync(make_pipelined, fns, steps=12)
    assert fast_steps(fast) == 12 * len(workers(fast))


def test_actions_of_another_dtype_go_pickled_and_reach_the_env_as_given(make_pipelined):
    fns = wire_fns("box", "dtype")
    envs = make_pipelined(fns, envs_per_worker=2)
    envs.reset(seed=0)
    as_float64 = np.full((NUM_ENVS, 2), 0.25, dtype=np.float64)
    _, rewards, _, _, infos = envs.step(as_float64)
    assert pickled_steps(envs) == len(workers(envs)) and fast_steps(envs) == 0
    assert list(infos["got"]) == ["ndarray:float64"] * NUM_ENVS
    _, rewards32, _, _, infos = envs.step(as_float64.astype(np.float32))
    assert fast_steps(envs) == len(workers(envs))
    assert list(infos["got"]) == ["ndarray:float32"] * NUM_ENVS
    np.testing.assert_array_equal(rewards, rewards32)


def test_staged_stepping_takes_the_fast_path_and_matches_sync(make_pipelined):
    fns = wire_fns("box", "scalars")
    ours = make_pipelined(fns, num_stages=2, envs_per_worker=1)
    ref = gym.vector.SyncVectorEnv(fns)
    try:
        assert_tree_equal(ours.reset(seed=2), ref.reset(seed=2))
        rng = np.random.default_rng(3)
        for _ in range(10):
            actions = draw(ref.single_action_space, rng)
            want = ref.step(actions)
            for s in (1, 0):  # out of order
                ours.step_async(actions[ours.stage_slices[s]], stage=s)
            parts = [ours.step_wait(stage=s) for s in (0, 1)]
            got = tuple(np.concatenate([p[i] for p in parts]) for i in range(4))
            assert_tree_equal(got, want[:4])
            for s, part in enumerate(parts):
                assert_tree_equal(part[4], slice_infos(want[4], ours.stage_slices[s]))
    finally:
        ref.close()
    assert fast_steps(ours) == 10 * NUM_ENVS and pickled_steps(ours) == 0


def test_decoupled_partial_steps_take_the_fast_path(make_pipelined):
    fns = [partial(WireEnv, i, 100, "box", "scalars") for i in range(NUM_ENVS)]  # no episode ends
    ours = make_pipelined(fns, envs_per_worker=2)
    single = [fn() for fn in fns]
    ours.async_reset(seed=4)
    obs, *_ = ours.recv(batch_size=NUM_ENVS, timeout=30)
    for i, env in enumerate(single):
        env.reset(seed=4 + i)  # gymnasium seeds env i with seed + i
    rng = np.random.default_rng(5)
    for round_ in range(8):
        ids = [0, 2] if round_ % 2 == 0 else [1, 3]  # one env of each worker: partial steps
        actions = draw(ACTION_SPACES["box"], rng, n=2)
        ours.send(actions, env_ids=np.array(ids))
        got_obs, rewards, terms, truncs, infos = ours.recv(batch_size=2, timeout=30)
        for k, g in enumerate(infos["env_id"]):
            want = single[g].step(actions[ids.index(g)])
            if want[2] or want[3]:
                want = (single[g].reset()[0], *want[1:4], {**want[4], **single[g].reset()[1]})
                break  # the autoreset step follows; compared by the other tests
            np.testing.assert_array_equal(got_obs[k], want[0])
            assert rewards[k] == want[1] and terms[k] == want[2] and truncs[k] == want[3]
            for key, value in want[4].items():
                assert infos[key][k] == value and infos[f"_{key}"][k]
    assert fast_steps(ours) == 8 * 2 and pickled_steps(ours) == 0


def test_per_env_infos_keep_the_envs_own_types(make_pipelined):
    fns = wire_fns("box", "scalars")
    ours = make_pipelined(fns, envs_per_worker=2, info_layout="per_env")
    single = [fn() for fn in fns]
    ours.reset(seed=0)
    for i, env in enumerate(single):
        env.reset(seed=i)
    actions = np.zeros((NUM_ENVS, 2), dtype=np.float32)
    for _ in range(3):  # the first answer pickles its infos (learns the layout), then columns
        _, _, _, _, infos = ours.step(actions)
        for i, env in enumerate(single):
            want = env.step(actions[i])[4]
            assert infos[i] == want
            assert [type(v) for v in infos[i].values()] == [type(v) for v in want.values()]
    assert sum(w.wire.fast_answers for w in workers(ours)) > 0


def test_column_infos_read_like_lists_of_info_dicts():
    layout = InfoLayout.learn([[{"a": 1.5, "b": np.int64(2)}], [{"a": 2.5, "b": np.int64(3)}]])
    assert layout is not None and layout.keys == ("a", "b")
    assert InfoLayout.learn([[{"a": 1.5}], [{"a": 2}]]) is None  # types differ
    assert InfoLayout.learn([[{"a": np.zeros(2)}]]) is None  # not a scalar
    columns = ColumnInfos(layout, [np.array([1.5, 2.5]), np.array([2, 3])], 2)
    assert columns[1] == [{"a": 2.5, "b": 3}] and type(columns[1][0]["b"]) is np.int64
    merged = columns.merge_into({}, 1, 3)
    np.testing.assert_array_equal(merged["a"], [0.0, 1.5, 2.5])
    np.testing.assert_array_equal(merged["_b"], [False, True, True])
    assert list(merged) == ["a", "_a", "b", "_b"]


def spin_as_on_a_quiet_machine(worker: Any) -> None:
    """Let the caller's waits on ``worker`` spin as where nothing else runs and a core is
    free for it and the caller (the test machine may be busy)."""
    worker.spin = 2
    worker.spin_gate = lambda own_processes: True


def test_worker_killed_mid_step_is_reported_with_spinning_on(make_pipelined):
    envs = make_pipelined([FaultyEnv], envs_per_worker=1)
    worker = workers(envs)[0]
    spin_as_on_a_quiet_machine(worker)
    envs.reset(seed=0)
    for _ in range(20):
        envs.step(np.array([FaultyEnv.NORMAL]))
    assert worker.wire.spins > 0  # quick answers: the waits spun
    with pytest.raises(WorkerCrashedError):
        envs.step(np.array([FaultyEnv.SIGKILL]))


def test_step_deadline_kills_a_spinning_wait(make_pipelined):
    envs = make_pipelined([partial(FaultyEnv, sleep_seconds=60)], step_deadline=1.0)
    spin_as_on_a_quiet_machine(workers(envs)[0])
    envs.reset(seed=0)
    for _ in range(5):
        envs.step(np.array([FaultyEnv.NORMAL]))
    with pytest.raises(WorkerCrashedError, match="step_deadline"):
        envs.step(np.array([FaultyEnv.SLEEP]))


class SerialFaultyEnv(FaultyEnv):
    """`FaultyEnv` that says its worker steps it one env after another."""

    metadata = {**FaultyEnv.metadata, "step_concurrency": "serial"}


def test_whole_worker_recv_spins_and_learns_of_a_killed_worker(
    make_pipelined, monkeypatch, lane_joins
):
    """EnvPool-style ``send``/``recv`` of a whole worker (its slot's lane) with the
    caller's waits spinning (on the slot, before the wait on the pipe): every env's count
    is right, the lane joins the results, and a worker killed mid-step is reported by
    ``recv``. (Each step sleeps 2 ms and the caller's core is not handed over after
    ``send``, so ``recv`` always waits; one worker, so one spin gate, whose probes come
    every 16 waits at the latest once the 2 ms waits closed it.)"""
    from pipelined_vec_env.stepping import decoupled

    monkeypatch.setattr(decoupled, "HAND_OVER_SECONDS", 0.0)
    # declared serial: envs that sleep would otherwise be measured off the CPU and stepped
    # concurrently, each answered alone (not through the whole worker's lane)
    envs = make_pipelined([partial(SerialFaultyEnv, sleep_seconds=0.002)] * 2, envs_per_worker=2)
    (worker,) = workers(envs)
    spin_as_on_a_quiet_machine(worker)
    envs.async_reset(seed=0)
    spins_at_reset = 0
    for count in range(50):
        if count:
            envs.send(np.full(2, FaultyEnv.SLEEP), [0, 1])
        obs, _, _, _, infos = envs.recv(batch_size=2, timeout=30)
        assert infos["env_id"].tolist() == [0, 1]
        assert obs[:, 0].tolist() == [count, count]
        if count == 0:  # the reset's answer comes the general way
            spins_at_reset = worker.wire.spins
    assert lane_joins.joined == 49  # every step's results joined by the lane
    assert worker.wire.spins > spins_at_reset  # the steps' waits spun (and missed: 2 ms)
    envs.send(np.array([FaultyEnv.NORMAL, FaultyEnv.SIGKILL]), [0, 1])
    with pytest.raises(WorkerCrashedError):
        envs.recv(batch_size=1, timeout=30)


def test_whole_worker_recv_enforces_step_deadline_while_others_answer(make_pipelined):
    """A worker past ``step_deadline`` is killed and reported by ``recv`` even while the
    other worker's answers keep arriving (each ``recv`` finds one already written)."""
    envs = make_pipelined(
        [partial(FaultyEnv, sleep_seconds=5.0)] * 2, envs_per_worker=1, step_deadline=0.3
    )
    envs.async_reset(seed=0)
    got = 0
    while got < 2:
        got += len(envs.recv(timeout=30)[-1]["env_id"])
    envs.send(np.array([FaultyEnv.SLEEP]), [1])  # hangs past the deadline
    started = time.monotonic()
    with pytest.raises(WorkerCrashedError):
        while time.monotonic() - started < 4.0:
            envs.send(np.array([FaultyEnv.NORMAL]), [0])
            time.sleep(0.005)  # env 0's answer is written before each recv
            _, _, _, _, infos = envs.recv(batch_size=1, timeout=30)
            assert infos["env_id"].tolist() == [0]  # env 1's late result never comes
    assert time.monotonic() - started < 4.0  # the kill, not the 5 s sleep's end


def test_env_exception_on_the_fast_path_is_reraised(make_pipelined):
    envs = make_pipelined([FaultyEnv] * 2, envs_per_worker=2)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="told to raise"):
        envs.step(np.array([FaultyEnv.NORMAL, FaultyEnv.RAISE]))
    assert fast_steps(envs) == 1


def test_nothing_spins_with_more_workers_than_cores(make_pipelined):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = (cores or 1) + 1  # the workers and the caller cannot have a core each
    envs = make_pipelined([FaultyEnv] * n, envs_per_worker=1)  # a worker per env
    envs.reset(seed=0)
    for _ in range(10):
        envs.step(np.zeros(n, dtype=np.int64))
    assert all(w.spin == 0 and w.wire.spins == 0 for w in workers(envs))
    # nor do the workers, which cannot have a core each either
    assert not any(w.worker_spin or w.wire.wakeless_steps for w in workers(envs))
    assert fast_steps(envs) == 10 * n


def test_fast_path_off_gives_workers_no_slot(make_pipelined):
    envs = make_pipelined([FaultyEnv] * 2, envs_per_worker=2, fast_path=False)
    envs.reset(seed=0)
    envs.step(np.zeros(2, dtype=np.int64))
    assert all(w.slot is None and w.spin == 0 for w in workers(envs))


@pytest.mark.skipif(
    not spinning.stores_ordered(), reason="the slots' spins need x86-64's store order"
)
def test_quick_steps_reach_a_spinning_worker_without_a_pipe_write(make_pipelined):
    """One worker (a core each for it: `spinning.can_spin`): after each quick answer it
    spins for the next step, which then comes through the slot alone; every result is
    still exactly SyncVectorEnv's.

    The steps run back to back (compared with SyncVectorEnv after the loop): the worker
    spins only while the caller sends its next step within the spin's budget. A load
    spike can keep every gap over the budget for a while, so up to `SPIN_TRIES` rounds
    run until one has a wakeless step; every round's results are compared."""
    fns = wire_fns("box", "scalars")
    envs = make_pipelined(fns, envs_per_worker=NUM_ENVS)
    (worker,) = workers(envs)
    assert worker.worker_spin
    rng = np.random.default_rng(2)
    steps = 0
    for _ in range(SPIN_TRIES):
        batches = [draw(envs.single_action_space, rng) for _ in range(500)]
        got = [envs.reset(seed=3)]
        got += [copy.deepcopy(envs.step(actions)) for actions in batches]
        assert_steps_match_sync(fns, got, batches, seed=3)
        steps += len(batches)
        if worker.wire.wakeless_steps > 0:
            break
    assert worker.wire.fast_steps == steps
    assert worker.wire.wakeless_steps > 0  # the worker spun for some of them


class SlowerWireEnv(WireEnv):
    """`WireEnv` whose step also keeps the CPU busy for ``busy_us`` microseconds."""

    def __init__(self, *args: Any, busy_us: float) -> None:
        super().__init__(*args)
        self.busy_us = busy_us

    def step(self, action):
        end = time.perf_counter() + self.busy_us * 1e-6
        while time.perf_counter() < end:
            pass
        return super().step(action)


def test_the_callers_wait_spins_for_the_last_answers_of_a_step(make_pipelined):
    """Two workers (one of them 60 us slower per step), each with a core
    (`spinning.can_spin`): once the first answer of a step came, the caller spins for the
    other (`WorkerPool.wait`) and finds it without sleeping; every result is still
    exactly SyncVectorEnv's.

    The steps are the stage's (``step_async(actions, 0)``): a whole-env step hands the
    caller's core over to the worker that shares it, and the caller may then come back
    only when both answered. As above, up to `SPIN_TRIES` rounds run until one has a
    spin that found the answer."""
    if not spinning.can_spin(2):
        pytest.skip("needs a core for each of two workers and x86-64's store order")
    fns = [
        partial(SlowerWireEnv, i, LENGTHS[i], "box", "floats", busy_us=60.0 * (i >= 2))
        for i in range(NUM_ENVS)
    ]
    envs = make_pipelined(fns, envs_per_worker=2, num_stages=1)
    assert all(w.worker_spin for w in workers(envs))
    slower = workers(envs)[1]
    rng = np.random.default_rng(4)
    for _ in range(SPIN_TRIES):
        batches = [draw(envs.single_action_space, rng) for _ in range(300)]
        got = [envs.reset(seed=3)]
        for actions in batches:
            envs.step_async(actions, 0)
            got.append(copy.deepcopy(envs.step_wait(0)))
        assert_steps_match_sync(fns, got, batches, seed=3)
        if slower.wire.spin_hits > 0:
            break
    assert slower.wire.spins > 0 and slower.wire.spin_hits > 0


def _readable(fd: int):
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return poller.poll


def _slot_pair() -> tuple[StepSlot, StepSlot]:
    """A slot and the worker's view of it (attached by name, as a worker does)."""
    caller = StepSlot(spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32), 1)
    return caller, pickle.loads(pickle.dumps(caller))


def test_a_step_sent_as_the_workers_spin_ends_still_reaches_it():
    """The caller saw the worker spinning, but the spin ended before the step came: the
    worker's timed polls still find the step in the slot (no pipe write ever comes)."""
    caller, worker = _slot_pair()
    quiet, other_end = socket.socketpair()
    try:
        worker.spin_for(1)
        assert caller.worker_spins_for_next()

        def send_late() -> None:
            time.sleep(0.05)  # after the worker's 1 ms spin below
            caller.note_sent_wakeless(WAKE_STEP_TIMED)

        sender = threading.Thread(target=send_late)
        sender.start()
        got = spin_for_message(worker, 1, _readable(quiet.fileno()), seconds=0.001)
        sender.join()
        assert got == WAKE_STEP_TIMED
        assert not caller.worker_spins_for_next()  # the spin is over
    finally:
        quiet.close()
        other_end.close()
        worker.release()
        caller.release()


def test_a_message_in_the_pipe_is_left_there_for_the_worker_to_read():
    caller, worker = _slot_pair()
    readable_end, writer = socket.socketpair()
    try:
        worker.spin_for(1)
        writer.send(b"x")  # a pickled message: the pipe, then the count
        caller.note_sent()
        assert spin_for_message(worker, 1, _readable(readable_end.fileno()), 0.001) is None
    finally:
        readable_end.close()
        writer.close()
        worker.release()
        caller.release()
