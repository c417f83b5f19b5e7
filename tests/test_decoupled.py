"""Decoupled stepping: async_reset / recv / send route every action to the env that asked."""

from __future__ import annotations

import time
from collections import Counter
from functools import partial

import numpy as np
import pytest
from gymnasium.error import NoAsyncCallError

from pipelined_vec_env import WaitTimeoutError, WorkerCrashedError
from pipelined_vec_env.debug_envs import CountingEnv, EchoEnv, FaultyEnv
from pipelined_vec_env.testing import kill_worker

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("num_stages,envs_per_worker", [(1, 1), (2, 2), (3, 3)])
def test_every_action_reaches_the_env_that_asked(make_pipelined, num_stages, envs_per_worker):
    n = 9
    envs = make_pipelined(
        [partial(EchoEnv, i) for i in range(n)],
        num_stages=num_stages,
        envs_per_worker=envs_per_worker,
    )
    envs.async_reset(seed=0)
    sent: dict[int, list[int]] = {i: [] for i in range(n)}
    steps = Counter()
    rng = np.random.default_rng(0)
    token = 0
    for _ in range(60):
        obs, _, _, _, info = envs.recv(batch_size=None if rng.random() < 0.5 else 1, timeout=30)
        ids = info["env_id"]
        assert len(set(ids.tolist())) == len(ids)
        for row, g in zip(obs, ids, strict=True):
            assert row[0] == g  # the observation came from env g
            assert row[1] == steps[g]  # no step lost or duplicated
            assert row[2] == (sent[g][-1] if sent[g] else -1)  # it executed g's last action
        # answer a random subset now; the rest in a later send
        order = rng.permutation(len(ids))
        cut = int(rng.integers(1, len(ids) + 1))
        for part in (order[:cut], order[cut:]):
            if len(part) == 0:
                continue
            actions = np.arange(token, token + len(part))
            token += len(part)
            envs.send(actions, ids[part])
            for g, a in zip(ids[part], actions, strict=True):
                sent[int(g)].append(int(a))
                steps[int(g)] += 1
    while envs.decoupled.in_flight:
        envs.recv(timeout=30)
    final = envs.call("__getattribute__", "steps")
    assert list(final) == [steps[i] for i in range(n)]


def test_recv_batch_size_and_env_ids(make_pipelined):
    envs = make_pipelined(
        [partial(CountingEnv, i, 100) for i in range(6)], num_stages=2, envs_per_worker=2
    )
    envs.async_reset(seed=0)
    obs, rew, term, trunc, info = envs.recv(batch_size=6, timeout=30)
    assert sorted(info["env_id"].tolist()) == list(range(6))
    assert rew.dtype == np.float64 and not term.any() and not trunc.any()
    np.testing.assert_array_equal(obs[:, 0], info["env_id"])  # CountingEnv obs[0] is its id
    assert "reset_noise" in info
    with pytest.raises(ValueError, match="duplicate"):
        envs.send(np.zeros(2, dtype=np.int64), [0, 0])
    with pytest.raises(ValueError, match=r"expected shape \(2,\)"):
        envs.send(np.zeros(3, dtype=np.int64), [0, 1])
    envs.send(np.ones(3, dtype=np.int64), [5, 1, 3])
    with pytest.raises(ValueError, match="not received"):
        envs.send(np.ones(1, dtype=np.int64), [5])
    with pytest.raises(ValueError, match="batch_size"):
        envs.recv(batch_size=4)
    obs, rew, *_, info = envs.recv(batch_size=3, timeout=30)
    assert sorted(info["env_id"].tolist()) == [1, 3, 5]
    np.testing.assert_array_equal(obs[:, 1], [1, 1, 1])
    by_id = dict(zip(info["env_id"].tolist(), rew.tolist(), strict=True))
    assert by_id == {1: 2.01, 3: 2.03, 5: 2.05}


def test_mixing_stage_calls_and_send_recv_is_refused(make_pipelined):
    envs = make_pipelined([partial(CountingEnv, i, 100) for i in range(4)], num_stages=2)
    with pytest.raises(NoAsyncCallError):
        envs.recv()
    envs.async_reset(seed=0)
    with pytest.raises(RuntimeError, match="send/recv"):
        envs.step_async(np.zeros(2, dtype=np.int64), stage=0)
    with pytest.raises(RuntimeError, match="send/recv"):
        envs.get_attr("count")
    envs.recv(batch_size=4, timeout=30)
    with pytest.raises(RuntimeError, match="send their actions"):
        envs.step(np.zeros(4, dtype=np.int64))
    obs, _ = envs.reset(seed=1)  # a reset takes received envs back
    envs.step(np.zeros(4, dtype=np.int64))


def test_timeout_keeps_results_for_the_next_recv(make_pipelined):
    envs = make_pipelined([partial(FaultyEnv, 1.0) for _ in range(2)], num_stages=2)
    envs.async_reset(seed=0)
    envs.recv(batch_size=2, timeout=30)
    envs.send(np.array([FaultyEnv.SLEEP, 0]), [0, 1])
    obs, *_, info = envs.recv(timeout=30)
    assert info["env_id"].tolist() == [1]
    with pytest.raises(WaitTimeoutError):
        envs.recv(timeout=0.05)
    obs, *_, info = envs.recv(timeout=30)
    assert info["env_id"].tolist() == [0] and obs[0, 0] == 1


def test_a_recv_timeout_0_loop_learns_of_a_dead_worker(make_pipelined):
    """A caller polling ``recv(timeout=0)`` while doing other work is told of a crash:
    ``recv``'s looks for answers already written skip the system call, its wait does not."""
    envs = make_pipelined([partial(FaultyEnv, 30.0) for _ in range(2)], envs_per_worker=1)
    envs.async_reset(seed=0)
    envs.recv(batch_size=2, timeout=30)
    envs.send(np.array([FaultyEnv.SLEEP, FaultyEnv.SLEEP]), [0, 1])
    kill_worker(envs, 0)
    deadline = time.monotonic() + 20
    with pytest.raises(WorkerCrashedError) as info:
        while time.monotonic() < deadline:
            try:
                envs.recv(timeout=0)
            except WaitTimeoutError:
                time.sleep(0.001)
    assert info.value.env_indices == (0,)


def test_crash_and_shutdown_with_requests_in_flight(make_pipelined):
    envs = make_pipelined([partial(FaultyEnv, 5.0) for _ in range(3)], num_stages=3)
    envs.async_reset(seed=0)
    envs.recv(batch_size=3, timeout=30)
    envs.send(np.array([FaultyEnv.SIGKILL, 0, FaultyEnv.SLEEP]), [0, 1, 2])
    results = []
    with pytest.raises(WorkerCrashedError) as info:
        for _ in range(2):
            results.append(envs.recv(timeout=30)[-1]["env_id"].tolist())
    assert info.value.env_indices == (0,)
    start = time.monotonic()
    envs.close(timeout=0.5)  # env 2 is still sleeping in its worker
    assert envs.closed and time.monotonic() - start < 30


def test_async_reset_rebuilds_a_dead_worker(make_pipelined):
    envs = make_pipelined([partial(FaultyEnv) for _ in range(2)])
    envs.async_reset(seed=0)
    envs.recv(batch_size=2, timeout=30)
    envs.send(np.array([FaultyEnv.SIGKILL, 0]), [0, 1])
    seen = []
    with pytest.raises(WorkerCrashedError):
        for _ in range(2):
            seen += envs.recv(timeout=30)[-1]["env_id"].tolist()
    if not seen:  # env 1's result came after the crash report
        seen += envs.recv(timeout=30)[-1]["env_id"].tolist()
    assert seen == [1]
    old_pid = envs.workers[0].process.pid
    envs.async_reset(seed=0)  # rebuilds worker 0 first
    obs, *_, info = envs.recv(batch_size=2, timeout=30)
    assert sorted(info["env_id"].tolist()) == [0, 1] and obs[:, 0].tolist() == [0, 0]
    assert envs.workers[0].process.pid != old_pid and envs.restart_counts == (0, 0)


def test_recv_returns_every_result_already_there(make_pipelined):
    """A ``recv`` whose batch is not ready yet still returns every result that has come by
    the time it first looks, beyond ``batch_size`` (the wait's first poll takes them all)."""
    envs = make_pipelined([partial(CountingEnv, i, 100) for i in range(4)], envs_per_worker=1)
    envs.async_reset(seed=0)
    deadline = time.monotonic() + 30
    while not all(w.answer_waiting() for w in envs.workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(w.answer_waiting() for w in envs.workers)
    *_, info = envs.recv(batch_size=1, timeout=30)
    assert sorted(info["env_id"].tolist()) == [0, 1, 2, 3]
    envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
    while not all(w.answer_waiting() for w in envs.workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    *_, info = envs.recv(batch_size=2, timeout=30)
    assert sorted(info["env_id"].tolist()) == [0, 1, 2, 3]
