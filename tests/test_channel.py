"""InferenceChannel: several actors serve env workers; every action reaches the env that asked."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from pipelined_vec_env import WaitTimeoutError
from pipelined_vec_env.debug_envs import CountingEnv, EchoEnv, FaultyEnv
from pipelined_vec_env.infos import split_infos
from pipelined_vec_env.stepping.channel import InferenceChannel, Transition, take_requests
from tests.conftest import assert_tree_equal

from .conftest import load_script

pytestmark = pytest.mark.timeout(120)

TOKEN = 100_000  # actions encode (env id, step): env_id * TOKEN + step


class FixedDelay(gym.Wrapper):
    """Sleeps a fixed, per-env time in each step, so envs advance at different rates."""

    def __init__(self, env: gym.Env, seconds: float) -> None:
        super().__init__(env)
        self.seconds = seconds

    def step(self, action: Any):
        time.sleep(self.seconds)
        return self.env.step(action)


def echo_policy(seen: list[tuple[int, ...]]):
    """A policy that checks the observations match their env ids and answers a token."""

    def policy(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
        assert obs.shape == (len(env_ids), 3)
        np.testing.assert_array_equal(obs[:, 0], env_ids)  # each row is from the env named
        seen.append(tuple(env_ids.tolist()))
        return env_ids * TOKEN + obs[:, 1]

    return policy


def test_taking_requests_with_a_tiny_max_wait_never_blocks_past_it():
    # Regression: with queue.SimpleQueue, get(timeout=...) whose deadline passed while it held
    # the queue's lock waited forever (CPython <= 3.13), so an actor sat on the requests it
    # had taken until the next post: the channel's rare hang with max_wait=0.001.
    requests: queue.Queue = queue.Queue()
    served: list[int] = []

    def actor() -> None:
        for i in range(20_000):
            requests.put(i)
            taken, stop = take_requests(requests, limit=2, max_wait=2e-6)
            assert not stop
            served.extend(taken)

    thread = threading.Thread(target=actor, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "an actor blocked past max_wait with an empty queue"
    assert served == list(range(20_000))


@pytest.mark.parametrize("num_stages,envs_per_worker", [(1, 1), (2, 2)])
def test_every_action_reaches_the_env_that_asked(make_pipelined, num_stages, envs_per_worker):
    # 8 env workers : 3 actors
    n = 8 * envs_per_worker
    envs = make_pipelined(
        [partial(EchoEnv, i, latency_seed=1000 + i) for i in range(n)],
        num_stages=num_stages,
        envs_per_worker=envs_per_worker,
    )
    seen: list[list[tuple[int, ...]]] = [[] for _ in range(3)]
    steps = 12
    streams: dict[int, list[Transition]] = {i: [] for i in range(n)}
    with InferenceChannel(envs, [echo_policy(s) for s in seen], max_wait=0.001) as channel:
        assert channel.num_workers == 8 and channel.rollout_queue_size == 3  # ceil(8 / 3)
        channel.reset(seed=0)
        for run in range(2):  # the second run continues each env from where it stopped
            rollout = channel.run(
                steps, on_transition=lambda t: streams[t.env_id].append(t), timeout=30
            )
            np.testing.assert_array_equal(rollout.steps, np.full(n, steps))
            for g, traj in enumerate(rollout.trajectories):
                assert traj.env_id == g and len(traj) == steps
                counts = np.arange(run * steps, (run + 1) * steps)
                np.testing.assert_array_equal(traj.obs[:, 0], g)
                np.testing.assert_array_equal(traj.obs[:, 1], counts)  # none lost or duplicated
                np.testing.assert_array_equal(traj.actions, g * TOKEN + counts)
                # each observation shows the env executed the action its env asked for
                np.testing.assert_array_equal(traj.obs[1:, 2], traj.actions[:-1])
            final = rollout.final_obs
            np.testing.assert_array_equal(final[:, 0], np.arange(n))
            np.testing.assert_array_equal(final[:, 1], (run + 1) * steps)
            last = np.array([t.actions[-1] for t in rollout.trajectories])
            np.testing.assert_array_equal(final[:, 2], last)
    assert list(envs.call("__getattribute__", "steps")) == [2 * steps] * n
    # every request was answered by exactly one actor, once
    asked = Counter(g for actor in seen for batch in actor for g in batch)
    assert asked == Counter({g: 2 * steps for g in range(n)})
    for g, stream in streams.items():
        assert [t.step for t in stream] == list(range(steps)) * 2
        assert all(t.env_id == g for t in stream)
    assert sum(len(s) for s in seen) > 0 and all(len(s) > 0 for s in seen)  # all actors served


def test_actor_takes_at_most_rollout_queue_size_env_batches(make_pipelined):
    envs = make_pipelined([partial(EchoEnv, i, 0.0) for i in range(4)], envs_per_worker=1)
    seen: list[tuple[int, ...]] = []
    with InferenceChannel(
        envs, [echo_policy(seen)], rollout_queue_size=2, max_wait=0.01
    ) as channel:
        channel.reset(seed=0)
        rollout = channel.run(10, timeout=30)
    (stats,) = rollout.actor_stats
    assert max(stats.env_batches) <= 2 and max(len(b) for b in seen) <= 2
    assert sum(stats.batch_sizes) == 4 * 10 and len(stats.queue_waits) == sum(stats.env_batches)
    assert all(w >= 0 for w in stats.queue_waits)
    summary = stats.summary()
    assert summary["envs"] == 40 and summary["calls"] == len(seen)


def test_partial_batch_when_no_more_requests_come(make_pipelined):
    # one env worker, an actor that would take 5 env batches: it must run after max_wait
    envs = make_pipelined([partial(EchoEnv, 0, 0.0)])
    seen: list[tuple[int, ...]] = []
    with InferenceChannel(
        envs, [echo_policy(seen)], rollout_queue_size=5, max_wait=0.02
    ) as channel:
        channel.reset(seed=0)
        rollout = channel.run(3, timeout=10)
    assert seen == [(0,), (0,), (0,)] and rollout.actor_stats[0].batch_sizes == [1, 1, 1]


def test_ratio_and_argument_validation(make_pipelined):
    envs = make_pipelined([partial(EchoEnv, i, 0.0) for i in range(4)], envs_per_worker=2)
    policy = echo_policy([])
    with pytest.raises(ValueError, match="3 actors but only 2 env workers"):
        InferenceChannel(envs, [policy] * 3)
    with pytest.raises(ValueError, match="policies"):
        InferenceChannel(envs, [])
    with pytest.raises(ValueError, match="rollout_queue_size"):
        InferenceChannel(envs, [policy], rollout_queue_size=-1)
    with pytest.raises(ValueError, match="max_wait"):
        InferenceChannel(envs, [policy], max_wait=-0.1)
    with InferenceChannel(envs, [policy] * 2) as channel:  # as many actors as workers is fine
        assert channel.rollout_queue_size == 1
        with pytest.raises(RuntimeError, match="reset"):
            channel.run(1)
        channel.reset(seed=0)
        with pytest.raises(ValueError, match="steps_per_env"):
            channel.run(0)
    with pytest.raises(RuntimeError, match="closed"):
        channel.run(1)


def test_actor_exception_is_raised_in_the_driving_thread(make_pipelined):
    class PolicyFailed(Exception):
        pass

    fail = threading.Event()
    fail.set()

    def policy(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
        if fail.is_set() and 3 in env_ids.tolist() and (obs[:, 1] >= 2).any():
            raise PolicyFailed("env 3 at step 2")
        return env_ids * TOKEN + obs[:, 1]

    envs = make_pipelined(
        [partial(EchoEnv, i, latency_seed=1000 + i) for i in range(4)],
        num_stages=2,
        envs_per_worker=1,
    )
    with InferenceChannel(envs, [policy] * 3) as channel:
        channel.reset(seed=0)
        with pytest.raises(PolicyFailed, match="env 3 at step 2") as info:
            channel.run(10, timeout=30)
        assert any(
            "inference actor" in note
            for note in getattr(info.value, "__notes__", ["inference actor"])
        )
        with pytest.raises(RuntimeError, match="call reset"):
            channel.run(1)
        fail.clear()
        channel.reset(seed=0)  # drains the envs still stepping and drops stale requests
        rollout = channel.run(4, timeout=30)
        np.testing.assert_array_equal(rollout.final_obs[:, 1], 4)

    bad_extras = make_pipelined([partial(EchoEnv, 0, 0.0)])
    with InferenceChannel(bad_extras, [lambda o, ids: (ids * 0, {"v": np.zeros(5)})]) as channel:
        channel.reset(seed=0)
        with pytest.raises(ValueError, match=r"extras\['v'\]"):
            channel.run(2, timeout=30)


def test_shutdown_with_requests_in_flight(make_pipelined):
    release = threading.Event()

    def stuck_policy(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
        if (obs[:, 0] > 0).any():  # envs 0 and 1 are back: stall like a hung device
            release.wait(30)
        return np.where(env_ids >= 2, FaultyEnv.SLEEP, FaultyEnv.NORMAL)

    envs = make_pipelined([partial(FaultyEnv, 3.0) for _ in range(4)], num_stages=2)
    channel = InferenceChannel(envs, [stuck_policy] * 2)
    try:
        channel.reset(seed=0)
        start = time.monotonic()
        with pytest.raises(WaitTimeoutError, match="at the actors|stepping"):
            channel.run(5, timeout=0.3)  # envs sleep 3 s in their workers; no reply in time
        channel.close(timeout=0.2)
        assert channel.closed
        envs.close(timeout=0.2)  # envs still sleeping in their workers
        assert envs.closed
        assert time.monotonic() - start < 20  # nothing waited for the 3 s sleeps or 30 s stall
    finally:
        release.set()
        channel.close()


def test_actor_stuck_at_close_then_replies_harmlessly(make_pipelined):
    release = threading.Event()
    calls = []

    def policy(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
        calls.append(1)
        if len(calls) > 1:
            release.wait(30)
        return env_ids * TOKEN + obs[:, 1]

    envs = make_pipelined([partial(EchoEnv, 0, 0.0)])
    channel = InferenceChannel(envs, [policy], name="stuck-at-close")
    channel.reset(seed=0)
    with pytest.raises(WaitTimeoutError):
        channel.run(3, timeout=0.3)
    channel.close(timeout=0.1)  # the actor is still inside its policy
    (actor,) = [t for t in threading.enumerate() if t.name == "stuck-at-close-actor-0"]
    release.set()
    actor.join(10)
    assert not actor.is_alive()  # it finished and left without touching fds


def counting_policy(kind: str):
    """Deterministic per observation (never looks at the other rows of its batch)."""

    def policy(obs: Any, env_ids: np.ndarray):
        if kind == "dict":
            count, noise = obs["count"][:, 1], obs["noise"][:, 0]
        else:
            count, noise = obs[:, 1].astype(np.int64), obs[:, 2]
        actions = ((count + (noise > 0)) % 3).astype(np.int64)
        return actions, {"value": noise.astype(np.float64) * 2, "count": count.reshape(-1, 1)}

    return policy


@pytest.mark.parametrize(
    "autoreset_mode,kind,num_stages,envs_per_worker,actors",
    [
        ("NextStep", "box", 1, 1, 3),
        ("SameStep", "box", 2, 2, 2),
        ("NextStep", "dict", 3, 1, 3),
        ("SameStep", "dict", 1, 2, 3),
    ],
)
def test_trajectories_equal_the_coupled_loop(
    make_pipelined, autoreset_mode, kind, num_stages, envs_per_worker, actors
):
    n, steps = 6, 14
    fns = [
        partial(lambda i: FixedDelay(CountingEnv(i, 3 + i, kind=kind), 0.0015 * (i % 3)), i)
        for i in range(n)
    ]
    envs = make_pipelined(
        fns, num_stages=num_stages, envs_per_worker=envs_per_worker, autoreset_mode=autoreset_mode
    )
    policy = counting_policy(kind)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space

    # the coupled loop: the whole env steps at once
    obs, _ = envs.reset(seed=7)
    expected: dict[str, list[Any]] = {
        k: [] for k in ("obs", "actions", "rewards", "terms", "truncs", "infos", "value")
    }
    for _ in range(steps):
        actions, extras = policy(obs, np.arange(n))
        expected["obs"].append(obs)
        expected["actions"].append(actions)
        expected["value"].append(extras["value"])
        obs, rewards, terms, truncs, infos = envs.step(actions)
        expected["rewards"].append(rewards)
        expected["terms"].append(terms)
        expected["truncs"].append(truncs)
        # recv's infos["env_id"] (global ids) replaces the env's own "env_id" key
        expected["infos"].append(split_infos(infos, n))
        for row in expected["infos"][-1]:
            row.pop("env_id", None)

    with InferenceChannel(envs, [policy] * actors, max_wait=0.001) as channel:
        channel.reset(seed=7)
        rollout = channel.run(steps, timeout=30)
    got = rollout.stack(obs_space, act_space)
    assert_tree_equal(got["obs"], _stack_tree([o for o in expected["obs"]]))
    assert_tree_equal(got["actions"], np.stack(expected["actions"]))
    assert_tree_equal(got["rewards"], np.stack(expected["rewards"]))
    assert_tree_equal(got["terminations"], np.stack(expected["terms"]))
    assert_tree_equal(got["truncations"], np.stack(expected["truncs"]))
    assert_tree_equal(got["extras"]["value"], np.stack(expected["value"]))
    assert got["extras"]["count"].shape == (steps, n, 1)
    assert_tree_equal(got["final_obs"], obs)
    for g, traj in enumerate(rollout.trajectories):
        assert_tree_equal(traj.infos, [expected["infos"][t][g] for t in range(steps)])
    assert (got["terminations"] | got["truncations"]).any()  # episodes did end


def _stack_tree(batches: list[Any]) -> Any:
    if isinstance(batches[0], dict):
        return {k: _stack_tree([b[k] for b in batches]) for k in batches[0]}
    if isinstance(batches[0], tuple):
        return tuple(_stack_tree([b[i] for b in batches]) for i in range(len(batches[0])))
    return np.stack(batches)


def test_evaluation_run_without_records(make_pipelined):
    envs = make_pipelined([partial(CountingEnv, i, 2 + i) for i in range(4)], num_stages=2)
    returns: dict[int, float] = {}
    ended: Counter[int] = Counter()

    def on_transition(t: Transition) -> None:
        returns[t.env_id] = returns.get(t.env_id, 0.0) + t.reward
        ended[t.env_id] += t.terminated or t.truncated

    with InferenceChannel(envs, [lambda o, ids: np.zeros(len(ids), dtype=np.int64)] * 2) as channel:
        channel.reset(seed=0)
        rollout = channel.run(100, record=False, on_transition=on_transition, episodes_per_env=1)
    assert rollout.trajectories is None
    # each env stopped right after its first episode, of length 2 + i
    np.testing.assert_array_equal(rollout.steps, [2, 3, 4, 5])
    assert ended == Counter({0: 1, 1: 1, 2: 1, 3: 1})
    # reward count + action + id/100 summed over counts 1..L
    assert returns == pytest.approx({i: sum(range(1, 3 + i)) + (2 + i) * i / 100 for i in range(4)})


def test_run_on_a_subset_of_envs(make_pipelined):
    envs = make_pipelined([partial(EchoEnv, i, 0.0) for i in range(4)], num_stages=2)
    with InferenceChannel(envs, [echo_policy([])] * 2) as channel:
        channel.reset(seed=0)
        rollout = channel.run(3, env_ids=[1, 2], timeout=30)
        np.testing.assert_array_equal(rollout.steps, [0, 3, 3, 0])
        np.testing.assert_array_equal(rollout.final_obs[:, 1], [0, 3, 3, 0])
        assert len(rollout.trajectories[0]) == 0 and len(rollout.trajectories[2]) == 3
        with pytest.raises(ValueError, match="env_ids"):
            channel.run(1, env_ids=[4])
        rollout = channel.run(2, timeout=30)  # the others start from where they waited
        np.testing.assert_array_equal(rollout.final_obs[:, 1], [2, 5, 5, 2])


def test_benchmark_runs_end_to_end(tmp_path):
    """``benchmarks/decoupled.py`` with tiny numbers: every mode runs, the JSON has its rows.

    No timing is asserted: a 3-env, 3-step run says nothing about speed.
    """
    pytest.importorskip("tyro")
    import json

    module = load_script("benchmarks/decoupled.py", "benchmarks_decoupled")
    out = tmp_path / "decoupled.json"
    args = module.Args(
        num_envs=3,
        steps=3,
        rounds=1,
        median_ms=0.5,
        infer_a_ms=0.1,
        infer_b_ms=0.01,
        actors=(1, 3),
        queue_sizes=(1, 0),
        extra_max_wait_ms=1.0,
        out=out,
    )
    module.main(args)
    report = json.loads(out.read_text())
    modes = [row["mode"] for row in report["rows"]]
    assert modes == [
        "sync",
        "staged-2",
        "decoupled a=1 q=1",
        "decoupled a=1 q=default",
        "decoupled a=1 q=default w=1ms",
        "decoupled a=3 q=1",
        "decoupled a=3 q=default",
        "decoupled a=3 q=default w=1ms",
    ]
    for row in report["rows"]:
        assert row["steps_per_s"] > 0
        if row["mode"].startswith("decoupled"):
            assert sum(row["per_actor_calls"]) > 0 and len(row["per_actor_calls"]) == row["actors"]
    assert report["rows"][3]["rollout_queue_size"] == 3  # ceil(3 workers / 1 actor)
