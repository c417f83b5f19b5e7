"""Property tests: random spaces, actions and call interleavings against a SyncVectorEnv model.

The model of a `PipelinedVectorEnv` is one `gymnasium.vector.SyncVectorEnv`
per stage over the same env constructors, stepped in the same per-env order: a stage
call is the model's call on that stage; a whole-env call is every stage's model call.
The envs hash every action they receive into their state and draw their observation from
it, so a misrouted or stale result shows up as a different observation or reward.

Properties checked, for every operation hypothesis draws:

- every result equals the model's (observations with dtypes, rewards, terminations,
  truncations, infos), including after a wait that timed out (never stale);
- invalid input (actions, stages, seeds, reset masks, env indices) and misuse (a second
  call on a busy stage, a wait with nothing in flight) raise ``ValueError`` /
  ``TypeError`` / ``AlreadyPendingCallError`` / ``NoAsyncCallError`` and change no env
  (the model is not stepped, and later results still match it);
- no wait hangs: each one has a timeout (`HANG`), and ``close`` returns with calls
  in flight on any stages and stops every worker.
"""

from __future__ import annotations

import sys
import time
import zlib
from collections.abc import Callable, Iterator
from copy import deepcopy
from functools import partial
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from pipelined_vec_env import PipelinedVectorEnv, WaitTimeoutError
from pipelined_vec_env.batching import batch_slice

from .conftest import assert_tree_equal, slice_infos

pytestmark = pytest.mark.timeout(300)

# workers receive this module's env by value: they need not import pytest or hypothesis
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Seconds any wait may take before the test calls it a hang.
HANG = 60.0

BAD_INPUT = (ValueError, TypeError)


class SpaceEnv(gym.Env):
    """An env over arbitrary spaces whose observations follow from the actions it got.

    ``delay`` (seconds, default 0) makes each step sleep first; it changes nothing else.
    ``digest`` starts from the reset seed's RNG and absorbs every action (crc32 of its
    flattened bytes); the observation is sampled from ``observation_space`` seeded with
    the digest; the reward is the digest mod 1000 plus ``env_id / 10``. Episodes end after
    ``episode_length`` steps (terminated for even ids, truncated for odd ones).
    """

    def __init__(
        self,
        env_id: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        episode_length: int,
    ) -> None:
        self.env_id = env_id
        self.observation_space = observation_space
        self.action_space = action_space
        self.episode_length = episode_length
        self.count = 0
        self.digest = 0
        self.delay = 0.0

    def _obs(self) -> Any:
        self.observation_space.seed(self.digest)
        return self.observation_space.sample()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.count = 0
        self.digest = int(self.np_random.integers(2**31))
        return self._obs(), {"env_id": self.env_id, "digest": self.digest}

    def step(self, action: Any):
        if self.delay:
            time.sleep(self.delay)  # a slow simulator: waits with a short timeout time out
        flat = np.asarray(spaces.flatten(self.action_space, action), dtype=np.float64)
        self.digest = zlib.crc32(flat.tobytes(), self.digest) & 0x7FFFFFFF
        self.count += 1
        done = self.count >= self.episode_length
        info: dict[str, Any] = {"count": self.count}
        if self.count % 2:
            info["odd"] = self.digest
        reward = self.digest % 1000 + self.env_id / 10
        return (
            self._obs(),
            reward,
            done and self.env_id % 2 == 0,
            done and self.env_id % 2 == 1,
            info,
        )

    def state(self) -> tuple[int, int, int]:
        """``(env_id, count, digest)``: everything the env's future depends on."""
        return self.env_id, self.count, self.digest


# ---------------------------------------------------------------------------- spaces

_BOX_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8]


@st.composite
def boxes(draw: st.DrawFn, bounded: bool) -> spaces.Box:
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    dtype = draw(st.sampled_from(_BOX_DTYPES))
    if np.dtype(dtype).kind == "f":
        low, high = (-1.0, 1.0) if bounded or draw(st.booleans()) else (-np.inf, np.inf)
    else:
        low, high = (0, 255) if dtype == np.uint8 else (-5, 5)
    return spaces.Box(low, high, shape=shape, dtype=dtype)


def leaf_spaces(bounded: bool) -> st.SearchStrategy[spaces.Space]:
    return st.one_of(
        boxes(bounded),
        st.builds(spaces.Discrete, st.integers(1, 5), start=st.integers(-3, 3)),
        st.lists(st.integers(2, 4), min_size=1, max_size=3).map(spaces.MultiDiscrete),
        st.one_of(st.integers(1, 4), st.just((2, 2))).map(spaces.MultiBinary),
    )


def any_spaces(bounded: bool = False) -> st.SearchStrategy[spaces.Space]:
    """Box (dtypes, shapes), Discrete, MultiDiscrete, MultiBinary, nested in Dict/Tuple."""
    return st.recursive(
        leaf_spaces(bounded),
        lambda children: st.one_of(
            st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=3).map(
                spaces.Dict
            ),
            st.lists(children, min_size=1, max_size=3).map(
                lambda items: spaces.Tuple(tuple(items))
            ),
        ),
        max_leaves=5,
    )


# ---------------------------------------------------------------------------- invalid actions


def _break_leaf(space: spaces.Space, batch: Any) -> Any | None:
    """``batch`` with one integer leaf out of its space (None if there is no such leaf)."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            broken = _break_leaf(sub, batch[key])
            if broken is not None:
                return {**batch, key: broken}
        return None
    if isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            broken = _break_leaf(sub, batch[i])
            if broken is not None:
                return tuple(broken if j == i else part for j, part in enumerate(batch))
        return None
    out = np.array(batch, copy=True)
    if isinstance(space, spaces.Discrete):
        out[0] = int(space.start) + int(space.n)
    elif isinstance(space, spaces.MultiDiscrete):
        out.reshape(len(out), -1)[0, 0] = space.nvec.flat[0]
    elif isinstance(space, spaces.MultiBinary):
        out.reshape(len(out), -1)[0, 0] = 2
    else:
        return None
    return out


def corrupt(space: spaces.Space, valid: Any, n: int, how: str, seed: int) -> Any:
    """An always-invalid batch of actions for ``n`` envs, derived from ``valid``."""
    if how == "garbage":
        return "not an action"
    if how == "leaf":
        broken = _break_leaf(space, valid)
        if broken is not None:
            return broken
    if how == "float" and isinstance(
        space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
    ):
        return np.asarray(valid, dtype=np.float64) + 0.5
    wrong = batch_space(space, n + 1)  # "length", and the fallback
    wrong.seed(seed)
    return wrong.sample()


# ---------------------------------------------------------------------------- the model


class Harness:
    """A PipelinedVectorEnv, its per-stage SyncVectorEnv models, and what is in flight.

    Each method performs one operation on the pipelined env, predicts its outcome from the
    models (an error, or the exact result), and checks it.
    """

    def __init__(self, envs: PipelinedVectorEnv, env_fns: list[Callable[[], gym.Env]]) -> None:
        self.envs = envs
        self.slices = envs.stage_slices
        self.models = [
            SyncVectorEnv(env_fns[s], autoreset_mode=envs.autoreset_mode) for s in self.slices
        ]
        self.model_obs: list[Any] = [None] * len(self.slices)
        #: how the last operation ended (for hypothesis' statistics)
        self.outcome = "ok"
        #: per stage: None or (op, whole, expected result of that stage)
        self.pending: list[tuple[str, bool, Any] | None] = [None] * len(self.slices)

    def close_models(self) -> None:
        for model in self.models:
            model.close()

    # -- helpers

    def _expect(self, call: Callable[[], Any], errors: Any, match: str | None = None) -> None:
        """Check that ``call`` raises one of ``errors``; record which as the outcome."""
        with pytest.raises(errors, match=match) as info:
            call()
        self.outcome = type(info.value).__name__

    def _stages(self, stage: Any) -> list[int] | None:
        """Stages selected by ``stage``, or None if it is not a valid stage argument."""
        if stage is None:
            return list(range(len(self.slices)))
        if isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage < len(self.slices):
            return [stage]
        return None

    def _span(self, stage: int | None) -> slice:
        return slice(0, self.envs.num_envs) if stage is None else self.slices[stage]

    def _relative(self, s: int, span: slice) -> slice:
        return slice(self.slices[s].start - span.start, self.slices[s].stop - span.start)

    def _model_state(self, g: int) -> tuple[int, int, int]:
        for s, sl in enumerate(self.slices):
            if sl.start <= g < sl.stop:
                return self.models[s].envs[g - sl.start].unwrapped.state()
        raise AssertionError(g)

    def _check(self, stage: int | None, op: str, result: tuple) -> None:
        span = self._span(stage)
        obs_space = self.envs.single_observation_space
        for s in self._stages(stage) or []:
            _, _, expected = self.pending[s]
            rel = self._relative(s, span)
            got = [batch_slice(obs_space, result[0], rel)]
            if op == "step":
                got += [np.asarray(part)[rel] for part in result[1:4]]
            got.append(slice_infos(result[-1], rel))
            want = [
                *expected[:-1],
                slice_infos(expected[-1], slice(0, self.slices[s].stop - self.slices[s].start)),
            ]
            assert_tree_equal(tuple(got), tuple(want), f"stage {s} {op}")
            self.pending[s] = None

    # -- operations

    def step_async(self, stage: Any, seed: int, corruption: str | None) -> None:
        selected = self._stages(stage)
        if selected is None:
            self._expect(
                lambda: self.envs.step_async(np.zeros(1), stage=stage), ValueError, match="stage"
            )
            return
        span = self._span(stage)
        n = span.stop - span.start
        batch = batch_space(self.envs.single_action_space, n)
        batch.seed(seed)
        valid = batch.sample()
        if any(self.pending[s] is not None for s in selected):
            self._expect(lambda: self.envs.step_async(valid, stage=stage), AlreadyPendingCallError)
            return
        if self.envs.autoreset_mode == AutoresetMode.DISABLED and any(
            self.models[s]._autoreset_envs.any() for s in selected
        ):
            # gymnasium asks for a reset of finished envs first (SyncVectorEnv asserts)
            self.outcome = "skipped: finished envs under DISABLED"
            return
        if corruption is not None:
            bad = corrupt(self.envs.single_action_space, valid, n, corruption, seed)
            self._expect(lambda: self.envs.step_async(bad, stage=stage), BAD_INPUT)
            return
        self.envs.step_async(valid, stage=stage)
        for s in selected:
            actions = batch_slice(self.envs.single_action_space, valid, self._relative(s, span))
            expected = self.models[s].step(actions)
            self.model_obs[s] = deepcopy(expected[0])
            self.pending[s] = ("step", stage is None, expected)

    def _wait(self, op: str, stage: Any, timeout: float | None) -> None:
        wait = self.envs.step_wait if op == "step" else self.envs.reset_wait
        selected = self._stages(stage)
        if selected is None:
            self._expect(lambda: wait(stage=stage, timeout=HANG), ValueError, match="stage")
            return
        matches = all(
            self.pending[s] is not None and self.pending[s][:2] == (op, stage is None)
            for s in selected
        )
        if not matches:
            self._expect(lambda: wait(stage=stage, timeout=HANG), NoAsyncCallError)
            return
        try:
            result = wait(stage=stage, timeout=HANG if timeout is None else timeout)
        except WaitTimeoutError:
            assert timeout is not None, f"{op}_wait(stage={stage}) hung for {HANG} s"
            self.outcome = "timed out"
            return  # still in flight: a later wait must return the real result
        self._check(stage, op, result)

    def step_wait(self, stage: Any, timeout: float | None) -> None:
        self._wait("step", stage, timeout)

    def reset_wait(self, stage: Any, timeout: float | None) -> None:
        self._wait("reset", stage, timeout)

    def reset_async(
        self, stage: Any, seed: int | None, mask: list[bool] | None, bad_seeds: bool
    ) -> None:
        selected = self._stages(stage)
        if selected is None:
            self._expect(
                lambda: self.envs.reset_async(seed=seed, stage=stage), ValueError, match="stage"
            )
            return
        span = self._span(stage)
        n = span.stop - span.start
        options = None
        mask_array = None
        if mask is not None:
            mask_array = np.resize(np.array(mask, dtype=np.bool_), n)
            options = {"reset_mask": mask_array}
        if bad_seeds or (mask_array is not None and not mask_array.any()):
            seeds = [0] * (n + 1) if bad_seeds else seed
            self._expect(
                lambda: self.envs.reset_async(seed=seeds, options=options, stage=stage), BAD_INPUT
            )
            return
        if any(self.pending[s] is not None for s in selected):
            self._expect(
                lambda: self.envs.reset_async(seed=seed, options=options, stage=stage),
                AlreadyPendingCallError,
            )
            return
        self.envs.reset_async(seed=seed, options=options, stage=stage)
        for s in selected:
            sl = self.slices[s]
            seeds = [None if seed is None else seed + g for g in range(sl.start, sl.stop)]
            part = None if mask_array is None else mask_array[self._relative(s, span)]
            if part is None:
                expected = self.models[s].reset(seed=seeds)
            elif part.any():
                expected = self.models[s].reset(seed=seeds, options={"reset_mask": part})
            else:  # nothing of this stage resets: it keeps its observations
                expected = (deepcopy(self.model_obs[s]), {})
            self.model_obs[s] = deepcopy(expected[0])
            self.pending[s] = ("reset", stage is None, expected)

    def call_at(self, indices: list[int]) -> None:
        if any(not 0 <= g < self.envs.num_envs for g in indices):
            self._expect(
                lambda: self.envs.call_at(indices, "state"), ValueError, match="env_indices"
            )
            return
        touched = {
            s for s, sl in enumerate(self.slices) for g in indices if sl.start <= g < sl.stop
        }
        if any(self.pending[s] is not None for s in touched):
            self._expect(lambda: self.envs.call_at(indices, "state"), AlreadyPendingCallError)
            return
        assert self.envs.call_at(indices, "state") == tuple(self._model_state(g) for g in indices)

    def set_delay(self, indices: list[int], delay: float) -> None:
        """Make the envs ``indices`` slow (or fast again); only the pipelined envs, since
        the delay changes no result."""
        touched = {
            s for s, sl in enumerate(self.slices) for g in indices if sl.start <= g < sl.stop
        }
        if any(self.pending[s] is not None for s in touched):
            self._expect(
                lambda: self.envs.set_attr_at(indices, "delay", delay), AlreadyPendingCallError
            )
            return
        self.envs.set_attr_at(indices, "delay", delay)

    def wait_pending(self, k: int, timeout: float | None) -> None:
        """The right wait for the ``k``-th call in flight (modulo their number), if any."""
        busy = [s for s, pending in enumerate(self.pending) if pending is not None]
        if busy:
            s = busy[k % len(busy)]
            op, whole, _ = self.pending[s]
            self._wait(op, None if whole else s, timeout)

    def resync(self, seed: int) -> None:
        """Bring the pipelined env and the models to the same known state, whatever an
        earlier (failed) example left behind: finish every call in flight unchecked, make
        every env fast, then reset everything with ``seed`` (which fixes each env's whole
        state) and check that reset."""
        for stage in self.envs.stages:
            if stage.state in ("step", "reset"):
                wait = self.envs.step_wait if stage.state == "step" else self.envs.reset_wait
                try:
                    wait(stage=None if stage.whole else stage.index, timeout=HANG)
                except Exception:  # a failed example's leftovers
                    pass
        self.pending = [None] * len(self.slices)
        self.envs.set_attr("delay", 0.0)
        self.reset_async(None, seed, None, False)
        self.reset_wait(None, None)

    def drain(self) -> None:
        """Wait for everything in flight, checking each result."""
        for s, pending in enumerate(self.pending):
            if pending is not None:
                op, whole, _ = pending
                self._wait(op, None if whole else s, None)
        assert self.pending == [None] * len(self.slices)

    def run(self, op: tuple) -> None:
        name, *args = op
        self.outcome = "ok"
        try:
            getattr(self, name)(*args)
        finally:
            event(f"{name}: {self.outcome}")


def operations(num_envs: int, num_stages: int) -> st.SearchStrategy[tuple]:
    """One random operation; stages include invalid ones (-1, ``num_stages``, True)."""
    valid_stage = st.one_of(st.none(), st.integers(0, num_stages - 1))
    stage = st.one_of(valid_stage, valid_stage, st.sampled_from([-1, num_stages, True]))
    timeout = st.sampled_from([None, None, 0.0])
    corruption = st.one_of(
        st.none(), st.none(), st.sampled_from(["length", "garbage", "leaf", "float"])
    )
    mask = st.one_of(st.none(), st.lists(st.booleans(), min_size=num_envs, max_size=num_envs))
    return st.one_of(
        st.tuples(st.just("step_async"), stage, st.integers(0, 2**16), corruption),
        st.tuples(st.just("step_wait"), stage, timeout),
        st.tuples(st.just("step_async"), stage, st.integers(0, 2**16), st.none()),
        st.tuples(st.just("step_wait"), stage, timeout),
        st.tuples(
            st.just("reset_async"),
            stage,
            st.one_of(st.none(), st.integers(0, 2**16)),
            mask,
            st.sampled_from([False, False, False, True]),  # a seed list of the wrong length
        ),
        st.tuples(st.just("reset_wait"), stage, timeout),
        st.tuples(st.just("call_at"), st.lists(st.integers(-1, num_envs), max_size=4)),
        st.tuples(st.just("wait_pending"), st.integers(0, num_stages - 1), timeout),
        st.tuples(st.just("wait_pending"), st.integers(0, num_stages - 1), timeout),
        st.tuples(
            st.just("set_delay"),
            st.lists(st.integers(0, num_envs - 1), min_size=1, max_size=3),
            st.sampled_from([0.0, 0.02]),
        ),
    )


# ---------------------------------------------------------------------------- properties

STAGED_OBS = spaces.Dict(
    {
        "pos": spaces.Box(-np.inf, np.inf, (2,), np.float32),
        "grid": spaces.Box(0, 255, (2, 2), np.uint8),
        "tup": spaces.Tuple((spaces.Discrete(3, start=-1), spaces.MultiBinary(3))),
    }
)
STAGED_ACT = spaces.Dict(
    {
        "move": spaces.Box(-1.0, 1.0, (2,), np.float32),
        "pick": spaces.Discrete(4),
        "bits": spaces.MultiBinary(2),
        "dial": spaces.MultiDiscrete([2, 3]),
    }
)
NUM_ENVS, NUM_STAGES = 7, 3  # stages of 3, 2, 2 envs; 2 envs per worker: 4 workers


def staged_fns() -> list[Callable[[], gym.Env]]:
    return [partial(SpaceEnv, i, STAGED_OBS, STAGED_ACT, 2 + i % 3) for i in range(NUM_ENVS)]


@pytest.fixture(scope="module")
def staged() -> Iterator[Harness]:
    """One pipelined env (and its models) reused by every example of the interleaving test."""
    envs = PipelinedVectorEnv(staged_fns(), num_stages=NUM_STAGES, envs_per_worker=2)
    harness = Harness(envs, staged_fns())
    try:
        yield harness
    finally:
        envs.close(terminate=True)
        harness.close_models()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    ops=st.lists(operations(NUM_ENVS, NUM_STAGES), min_size=8, max_size=30),
)
def test_random_interleavings_match_the_model(staged: Harness, seed: int, ops: list[tuple]) -> None:
    staged.resync(seed)
    for op in ops:
        staged.run(op)
    staged.drain()
    every = list(range(NUM_ENVS))
    assert staged.envs.call_at(every, "state") == tuple(staged._model_state(g) for g in every)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # each example starts workers: shrinking would take minutes; the report shows the
    # failing spaces and operations as drawn
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(
    obs_space=any_spaces(),
    act_space=any_spaces(bounded=True),
    mode=st.sampled_from(list(AutoresetMode)),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_random_spaces_match_the_model_and_close_in_flight(
    obs_space: spaces.Space,
    act_space: spaces.Space,
    mode: AutoresetMode,
    seed: int,
    data: st.DataObject,
) -> None:
    fns = [partial(SpaceEnv, i, obs_space, act_space, 2 + i % 2) for i in range(3)]
    envs = PipelinedVectorEnv(fns, num_stages=2, envs_per_worker=2, autoreset_mode=mode)
    harness = Harness(envs, fns)
    try:
        harness.reset_async(None, seed, None, False)
        harness.reset_wait(None, None)
        ops = data.draw(st.lists(operations(3, 2), min_size=6, max_size=15), label="ops")
        for op in ops:
            harness.run(op)
        harness.drain()
        in_flight = data.draw(
            st.lists(st.booleans(), min_size=2, max_size=2), label="in flight at close"
        )
        for s, busy in enumerate(in_flight):
            if busy:
                harness.step_async(s, seed + s, None)
        pids = [w.process.pid for stage in envs.stages for w in stage.workers]
        envs.close(timeout=HANG)
        assert envs.closed
        for pid in pids:
            assert (
                not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            )
    finally:
        envs.close(terminate=True)
        harness.close_models()
