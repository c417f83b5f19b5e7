"""The worker layer: typed protocol answers and the WorkerPool under stage stepping."""

from __future__ import annotations

import pickle
import time
from functools import partial

import numpy as np
import pytest

from pipelined_vec_env import WorkerCrashedError
from pipelined_vec_env.debug_envs import CountingEnv, FaultyEnv, UnpicklableError
from pipelined_vec_env.testing import kill_worker
from pipelined_vec_env.workers.pool import InFlight
from pipelined_vec_env.workers.protocol import (
    NO_ANSWER,
    Command,
    Ok,
    Raised,
    Ready,
    from_wire,
    to_wire,
)

pytestmark = pytest.mark.timeout(120)


def test_commands_compare_as_their_names_and_answers_pickle():
    assert Command.STEP == "step" and Command("reset") is Command.RESET
    assert NO_ANSWER == {"attach", "set_autoreset", "attach_slot"}
    ok = pickle.loads(pickle.dumps(Ok({"a": 1}, (1, 2))))
    assert isinstance(ok, Ok) and ok.ok and ok.payload == {"a": 1} and ok.times == (1, 2)
    ready = pickle.loads(pickle.dumps(Ready({"metadata": {}})))
    assert ready.ok and ready.kind == "ready" and ready.description == {"metadata": {}}
    # the pipe's compact encoding gives back the same answers
    wire = from_wire(pickle.loads(pickle.dumps(to_wire(Ok([1.0], (3, 4))))))
    assert isinstance(wire, Ok) and wire.payload == [1.0] and wire.times == (3, 4)
    assert from_wire(to_wire(Ok(None))).times is None
    assert from_wire(to_wire(Ready({"spec": None}))).description == {"spec": None}
    raised = from_wire(to_wire(Raised(None, "builtins.OSError", "disk", "tb")))
    assert isinstance(raised, Raised) and (raised.type_name, raised.traceback) == (
        "builtins.OSError",
        "tb",
    )
    with pytest.raises(ValueError, match="not a protocol answer"):
        from_wire(("ok", None))


def test_raised_rebuilds_the_exception_or_keeps_its_description():
    try:
        raise KeyError("missing")
    except KeyError as exc:
        raised = pickle.loads(pickle.dumps(Raised.from_exception(exc)))
    assert not raised.ok and raised.type_name == "builtins.KeyError"
    assert isinstance(raised.exception(), KeyError) and "raise KeyError" in raised.traceback
    try:
        raise UnpicklableError("no pickle")
    except UnpicklableError as exc:
        raised = Raised.from_exception(exc)
    assert raised.pickled is None and raised.exception() is None
    assert raised.type_name.endswith("UnpicklableError") and raised.message


def test_the_pool_queues_each_command_with_its_envs_until_answered(make_pipelined):
    envs = make_pipelined(
        [partial(CountingEnv, i) for i in range(4)], num_stages=2, envs_per_worker=1
    )
    envs.reset(seed=0)
    envs.step_async(np.zeros(2, dtype=np.int64), stage=1)
    pool = envs.pool
    stage1 = envs.stages[1].workers
    queued = [pool.in_flight(w) for w in stage1]
    assert [[(q.command, q.env_ids) for q in qs] for qs in queued] == [
        [(Command.STEP, (2,))],
        [(Command.STEP, (3,))],
    ]
    assert all(isinstance(q, InFlight) for qs in queued for q in qs)
    assert pool.idle(envs.stages[0].workers) and not pool.idle(stage1)
    envs.step_wait(stage=1)
    assert pool.idle(stage1)


def test_wait_any_kills_a_worker_past_step_deadline(make_pipelined):
    """One clock for every wait: `wait_any` applies `step_deadline` as `step_wait` does,
    so a hung stage completes (as a crash) instead of blocking `wait_any`."""
    envs = make_pipelined(
        [partial(FaultyEnv, 60.0) for _ in range(2)], num_stages=2, step_deadline=0.5
    )
    envs.reset(seed=0)
    envs.step_async(np.array([FaultyEnv.SLEEP]), stage=0)
    envs.step_async(np.array([FaultyEnv.NORMAL]), stage=1)
    first = envs.wait_any(timeout=30)
    assert first == 1
    envs.step_wait(stage=1)
    assert envs.wait_any(timeout=30) == 0
    with pytest.raises(WorkerCrashedError, match="step_deadline") as info:
        envs.step_wait(stage=0)
    assert info.value.env_indices == (0,)


def test_poll_written_takes_written_answers_and_leaves_a_death_to_the_next_wait(make_pipelined):
    """`poll_written` is a look without a wait: it takes the answers already written
    (read from the slots' counters) and says nothing of a worker that died, which the
    next waiting `poll` reports, so no caller loses a crash to a look."""
    envs = make_pipelined([partial(FaultyEnv, 30.0) for _ in range(2)], envs_per_worker=1)
    envs.reset(seed=0)
    pool, workers = envs.pool, list(envs.workers)
    assert all(w.slot is not None for w in workers)  # the counters the look reads
    envs.step_async(np.array([FaultyEnv.NORMAL, FaultyEnv.SLEEP]))
    done: list = []
    deadline = time.monotonic() + 20
    while not done and time.monotonic() < deadline:
        done = pool.poll_written(workers)
    assert [(w.index, c.command) for w, c in done] == [(0, Command.STEP)]
    kill_worker(envs, 1)
    assert pool.poll_written(workers) == []  # a look: the death is not read here
    crashed = pool.poll(workers, 20.0)
    assert [w.index for w, _ in crashed] == [1]
    with pytest.raises(WorkerCrashedError) as info:  # the crash the poll read
        envs.step_wait()
    assert info.value.env_indices == (1,)


def test_decoupled_sends_queue_on_the_pool_and_answer_in_order(make_pipelined):
    """Decoupled stepping is per-env bookkeeping over the pool: two sends to one worker
    are two commands in its queue (each with its envs), taken in order by `recv`."""
    envs = make_pipelined(
        [partial(CountingEnv, i, episode_length=50) for i in range(2)], envs_per_worker=2
    )
    envs.async_reset(seed=0)
    envs.recv(batch_size=2, timeout=30)
    (worker,) = envs.workers
    pool = envs.pool
    assert pool.idle([worker])
    envs.send(np.array([1]), env_ids=[1])
    envs.send(np.array([0]), env_ids=[0])
    assert [(q.command, q.env_ids) for q in pool.in_flight(worker)] == [
        (Command.STEP, (1,)),
        (Command.STEP, (0,)),
    ]
    with pytest.raises(RuntimeError, match="send/recv commands in flight"):
        envs.call("get_wrapper_attr", "env_id")
    obs, rewards, *_, infos = envs.recv(batch_size=2, timeout=30)
    assert infos["env_id"].tolist() == [1, 0]
    assert rewards.tolist() == [1 + 1 + 0.01, 1 + 0 + 0.0]
    assert pool.idle([worker])
