"""``backend="ray"``: env workers as Ray actors, checked against the multiprocessing backend.

One local Ray instance (``ray.init(num_cpus=2)``) serves every test but the slow two-node
cluster test; Ray start-up dominates the run time. Actors reserve a quarter CPU each so
that several vector envs fit in the two CPUs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from functools import partial

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from pipelined_vec_env import (
    PipelinedVectorEnv,
    RemoteTraceback,
    StageFailedError,
    WaitTimeoutError,
    WorkerCrashedError,
    WorkerError,
)
from pipelined_vec_env.debug_envs import CountingEnv, FaultyEnv

from .conftest import assert_tree_equal

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(180)

F = FaultyEnv
SMALL = {"num_cpus": 0.25}


class _RaySessions:
    """Keeps at most one Ray session: the shared local one, or a test's own cluster."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.cluster = None

    def local(self) -> None:
        if self.kind == "local" and ray.is_initialized():
            return
        self.stop()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        self.kind = "local"

    def two_nodes(self):
        from ray.cluster_utils import Cluster

        self.stop()
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        cluster.add_node(num_cpus=1, resources={"sim": 2})
        cluster.wait_for_nodes()
        self.cluster, self.kind = cluster, "cluster"
        return cluster  # not connected: the first vector env connects through its options

    def stop(self) -> None:
        if ray.is_initialized():
            ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
        self.kind = None


@pytest.fixture(scope="module")
def ray_sessions() -> Iterator[_RaySessions]:
    sessions = _RaySessions()
    yield sessions
    sessions.stop()  # never leave Ray processes behind


@pytest.fixture
def ray_local(ray_sessions: _RaySessions) -> None:
    ray_sessions.local()


def kill_actor(actor) -> None:
    """``ray.kill`` and wait until the actor is gone (the kill is asynchronous: a call
    submitted right after it may still run)."""
    ray.kill(actor)
    for _ in range(300):
        try:
            ray.get(actor.pid.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            continue
    raise AssertionError("the killed actor still answers")


def acts(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def counting_fns(n: int = 4, kind: str = "dict") -> list:
    return [partial(CountingEnv, i, 3 + i, kind) for i in range(n)]


def test_core_import_does_not_import_ray():
    code = "import sys, pipelined_vec_env; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_same_trace_as_multiprocessing(ray_local, make_pipelined):
    kwargs = dict(num_stages=2, envs_per_worker=2, autoreset_mode=AutoresetMode.SAME_STEP)
    r = make_pipelined(counting_fns(), backend="ray", ray_options=SMALL, **kwargs)
    m = make_pipelined(counting_fns(), **kwargs)
    assert r.shared_memory is False and all(h.backend == "ray" for h in r.workers)
    assert_tree_equal(r.reset(seed=3), m.reset(seed=3))
    for t in range(7):  # crosses every env's episode end (lengths 3..6)
        a = acts(t % 3, (t + 1) % 3, 2, t % 2)
        assert_tree_equal(r.step(a), m.step(a), f"step {t}")
    # per-stage calls, in an interleaved order
    for envs in (r, m):
        envs.step_async(acts(1, 1), stage=1)
        envs.step_async(acts(2, 0), stage=0)
    assert_tree_equal(r.step_wait(stage=0), m.step_wait(stage=0))
    assert r.wait_any() == 1
    assert_tree_equal(r.step_wait(stage=1), m.step_wait(stage=1))
    assert_tree_equal(
        r.reset(
            seed=[5, None, 7, None], options={"reset_mask": np.array([True, False, True, False])}
        ),
        m.reset(
            seed=[5, None, 7, None], options={"reset_mask": np.array([True, False, True, False])}
        ),
    )
    r.set_attr_at([3], "episode_length", 50)
    m.set_attr_at([3], "episode_length", 50)
    assert r.call_at([3, 0], "episode_length") == m.call_at([3, 0], "episode_length") == (50, 3)
    assert r.call("count") == m.call("count")


def test_decoupled_send_recv_matches_multiprocessing(ray_local, make_pipelined):
    r = make_pipelined(counting_fns(kind="box"), num_stages=2, backend="ray", ray_options=SMALL)
    m = make_pipelined(counting_fns(kind="box"), num_stages=2)
    traces: list[dict[int, list]] = []
    for envs in (r, m):
        trace: dict[int, list] = {i: [] for i in range(4)}
        envs.async_reset(seed=11)
        # 10 rounds, then on until every env has answered (a loaded machine may hold one
        # actor's reset back while the others answer; 200 rounds bound the loop)
        for round_ in range(200):
            if round_ >= 10 and all(trace.values()):
                break
            obs, rew, term, trunc, info = envs.recv(batch_size=2)
            for k, g in enumerate(info["env_id"]):
                trace[int(g)].append((obs[k].tolist(), rew[k], term[k], trunc[k]))
            envs.send(info["env_id"] % 3, info["env_id"])
        envs.recv(batch_size=2)  # drain: 2 envs are still in flight
        traces.append(trace)
    for g in range(4):  # arrival order may differ; each env's own sequence may not
        n = min(len(traces[0][g]), len(traces[1][g]))
        assert n > 0 and traces[0][g][:n] == traces[1][g][:n], g


def test_inference_channel_with_ray_workers_matches_multiprocessing(ray_local, make_pipelined):
    from pipelined_vec_env.stepping.channel import InferenceChannel

    def policy(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
        return (env_ids + obs[:, 1].astype(np.int64)) % 3

    rollouts = []
    for envs in (
        make_pipelined(counting_fns(kind="box"), num_stages=2, backend="ray", ray_options=SMALL),
        make_pipelined(counting_fns(kind="box"), num_stages=2),
    ):
        with InferenceChannel(envs, [policy, policy], max_wait=0.001) as channel:
            channel.reset(seed=3)
            rollouts.append(channel.run(6, timeout=60))
    for ray_traj, mp_traj in zip(rollouts[0].trajectories, rollouts[1].trajectories, strict=True):
        np.testing.assert_array_equal(ray_traj.obs, mp_traj.obs)
        np.testing.assert_array_equal(ray_traj.actions, mp_traj.actions)
        np.testing.assert_array_equal(ray_traj.rewards, mp_traj.rewards)


def test_decoupled_dead_actor_is_reported_and_other_envs_go_on(ray_local, make_pipelined):
    envs = make_pipelined(
        [partial(FaultyEnv) for _ in range(2)], num_stages=2, backend="ray", ray_options=SMALL
    )
    envs.async_reset(seed=0)
    _, _, _, _, info = envs.recv(batch_size=2)
    assert sorted(info["env_id"].tolist()) == [0, 1]
    envs.send(acts(0, F.EXIT), np.array([0, 1]))
    env0_counts = []  # env 0's result arrives before or after the crash report
    with pytest.raises(WorkerCrashedError) as crash:
        for _ in range(2):
            obs, *_, info = envs.recv(batch_size=1)
            env0_counts += [o[0] for o, g in zip(obs, info["env_id"], strict=True) if g == 0]
    assert crash.value.env_indices == (1,)
    if not env0_counts:
        obs, *_, info = envs.recv(batch_size=1)
        assert info["env_id"].tolist() == [0]
        env0_counts.append(obs[0, 0])
    assert env0_counts == [1]
    envs.send(acts(0), np.array([0]))  # the other env goes on
    obs, *_, info = envs.recv(batch_size=1)
    assert info["env_id"].tolist() == [0] and obs[0, 0] == 2


def test_decoupled_dead_actor_is_restarted_within_max_restarts(ray_local, make_pipelined):
    envs = make_pipelined(
        [partial(FaultyEnv) for _ in range(2)], backend="ray", ray_options=SMALL, max_restarts=1
    )
    envs.async_reset(seed=0)
    envs.recv(batch_size=2)
    envs.send(acts(0, F.EXIT), np.array([0, 1]))
    got = {}
    while len(got) < 2:
        obs, _, _, trunc, info = envs.recv(timeout=60)
        for k, g in enumerate(info["env_id"].tolist()):
            restarted = bool(info.get("_worker_restarted", np.zeros(len(trunc), bool))[k])
            got[g] = (obs[k, 0], bool(trunc[k]), restarted)
    assert got == {0: (1, False, False), 1: (0, True, True)}
    assert envs.restart_counts == (0, 1)
    envs.send(acts(0, 0), np.array([0, 1]))  # env 1: NEXT_STEP's autoreset step, then on
    obs, *_, info = envs.recv(batch_size=2, timeout=60)
    assert dict(zip(info["env_id"].tolist(), obs[:, 0].tolist(), strict=True)) == {0: 2, 1: 0}


def test_worker_exceptions_keep_type_and_traceback(ray_local, make_pipelined):
    envs = make_pipelined([partial(FaultyEnv) for _ in range(2)], backend="ray", ray_options=SMALL)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="told to raise") as info:
        envs.step(acts(F.RAISE, 0))
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "FaultyEnv" in str(info.value.__cause__)
    envs.reset(seed=0)  # a failed stage is usable again after a reset
    with pytest.raises(WorkerError):
        envs.step(acts(0, F.UNPICKLABLE_ERROR))
    with pytest.raises(StageFailedError):
        envs.step(acts(0, 0))


def test_timeout_keeps_the_call_in_flight(ray_local, make_pipelined):
    envs = make_pipelined(
        [partial(FaultyEnv, 1.0) for _ in range(2)], backend="ray", ray_options=SMALL
    )
    envs.reset(seed=0)
    envs.step_async(acts(F.SLEEP, 0))
    with pytest.raises(WaitTimeoutError):
        envs.step_wait(timeout=0.05)
    obs, *_ = envs.step_wait()  # the real result, not a stale one
    np.testing.assert_array_equal(obs[:, 0], [1, 1])
    obs, *_ = envs.step(acts(0, 0))
    np.testing.assert_array_equal(obs[:, 0], [2, 2])


@pytest.mark.parametrize("how", ["ray.kill", F.EXIT, F.SIGKILL])
def test_dead_actor_is_a_crash_and_other_stages_go_on(ray_local, make_pipelined, how):
    envs = make_pipelined(
        [partial(FaultyEnv) for _ in range(2)], num_stages=2, backend="ray", ray_options=SMALL
    )
    envs.reset(seed=0)
    if how == "ray.kill":
        kill_actor(envs.stages[1].workers[0].actor)
        how = 0
    envs.step_async(acts(how), stage=1)
    with pytest.raises(WorkerCrashedError) as info:
        envs.step_wait(stage=1)
    assert info.value.worker_index == 1 and info.value.env_indices == (1,)
    envs.step_async(acts(0), stage=0)
    obs0, *_ = envs.step_wait(stage=0)
    assert obs0[0, 0] == 1
    with pytest.raises(StageFailedError):
        envs.step_async(acts(0), stage=1)
    obs, _ = envs.reset(seed=0)  # a reset rebuilds the dead actor (not counted as a restart)
    assert obs[:, 0].tolist() == [0, 0] and envs.restart_counts == (0, 0)
    obs, *_ = envs.step(acts(0, 0))
    assert obs[:, 0].tolist() == [1, 1]


def test_killed_actor_is_restarted(ray_local, make_pipelined):
    envs = make_pipelined(
        [partial(CountingEnv, i, 100) for i in range(2)],
        num_stages=2,
        backend="ray",
        ray_options=SMALL,
        max_restarts=1,
    )
    envs.reset(seed=0)
    envs.step(acts(0, 0))
    victim = envs.stages[1].workers[0]
    old_pid = victim.pid
    kill_actor(victim.actor)
    obs, rew, term, trunc, info = envs.step(acts(0, 0))
    assert trunc.tolist() == [False, True] and info["worker_restarted"][1]
    np.testing.assert_array_equal(obs[:, 1], [2, 0])  # env 1 starts over
    assert envs.restart_counts == (0, 1) and victim.pid != old_pid
    obs, *_ = envs.step(acts(0, 0))
    np.testing.assert_array_equal(obs[:, 1], [3, 0])  # NEXT_STEP: the autoreset step
    kill_actor(victim.actor)
    with pytest.raises(WorkerCrashedError):  # past max_restarts
        envs.step(acts(0, 0))


def test_reset_rebuilds_an_actor_that_died_while_idle(ray_local, make_pipelined):
    envs = make_pipelined(
        [partial(CountingEnv, i, 100) for i in range(4)],
        num_stages=2,
        envs_per_worker=1,
        backend="ray",
        ray_options=SMALL,
    )
    envs.reset(seed=0)
    victim = envs.stages[1].workers[1]
    kill_actor(victim.actor)  # while idle, max_restarts=0
    envs.reset_async(seed=1, stage=1)
    obs, info = envs.reset_wait(stage=1)
    assert obs[:, 0].tolist() == [2, 3] and envs.restart_counts == (0, 0, 0, 0)
    obs, *_ = envs.step(acts(0, 0, 0, 0))
    assert obs[:, 1].tolist() == [1, 1, 1, 1]


def test_step_deadline_kills_a_hung_actor(ray_local, make_pipelined):
    envs = make_pipelined(
        [partial(FaultyEnv, 60.0) for _ in range(2)],
        backend="ray",
        ray_options=SMALL,
        step_deadline=0.5,
        max_restarts=1,
    )
    envs.reset(seed=0)
    _, _, _, trunc, info = envs.step(acts(F.SLEEP, 0))
    assert trunc.tolist() == [True, False] and info["worker_restarted"][0]


def test_start_timeout_covers_actor_creation(ray_local, make_pipelined):
    # an actor that can never be placed: its creation is bounded by start_timeout too
    options = {**SMALL, "resources": {"nowhere": 1.0}, "check_resources": False}
    with pytest.raises(WaitTimeoutError, match="start_timeout"):
        PipelinedVectorEnv(counting_fns(2), backend="ray", ray_options=options, start_timeout=2.0)
    envs = make_pipelined(counting_fns(2), backend="ray", ray_options=SMALL, start_timeout=60.0)
    assert envs.reset(seed=0)[0]["count"].shape == (2, 2)


def test_placement_group_bundles(ray_local, make_pipelined):
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 0.25}, {"CPU": 0.25}])
    ray.get(pg.ready(), timeout=60)
    try:
        envs = make_pipelined(
            counting_fns(2, "box"),
            num_stages=2,
            backend="ray",
            ray_options={"num_cpus": 0.25, "placement_group": pg, "bundle_indices": [1, 0]},
        )
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 3)
        envs.close()
    finally:
        remove_placement_group(pg)


def test_bad_ray_options_rejected_before_actors_start(ray_local):
    with pytest.raises(ValueError, match="unknown keys"):
        PipelinedVectorEnv(counting_fns(2), backend="ray", ray_options={"cpus": 1})
    with pytest.raises(ValueError, match="cannot all be placed"):
        PipelinedVectorEnv(counting_fns(2), backend="ray", ray_options={"num_cpus": 2})
    with pytest.raises(ValueError, match="backend"):
        PipelinedVectorEnv(counting_fns(2), backend="dask")
    with pytest.raises(ValueError, match="ray_options"):
        PipelinedVectorEnv(counting_fns(2), ray_options=SMALL)


def test_trainer_flag_builds_ray_workers(ray_local):
    tyro = pytest.importorskip("tyro")
    from reference_trainer.config import TrainConfig
    from reference_trainer.envs import GymEnvFactory, make_vector_env

    config = tyro.cli(TrainConfig, args=["--backend", "ray", "--ray-num-cpus", "0.25"])
    assert (config.backend, config.ray_num_cpus, config.ray_address) == ("ray", 0.25, None)
    envs = make_vector_env(
        GymEnvFactory("CartPole-v1"),
        2,
        num_stages=2,
        backend=config.backend,
        ray_options={"num_cpus": config.ray_num_cpus},
    )
    try:
        assert all(h.backend == "ray" for h in envs.workers)
        obs, _ = envs.reset(seed=0)
        obs, *_ = envs.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 4)
    finally:
        envs.close()


def test_overhead_benchmark_runs(ray_local, tmp_path):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "ray_overhead.py"
    spec = importlib.util.spec_from_file_location("benchmarks_ray_overhead", script)
    bench = importlib.util.module_from_spec(spec)
    # registered while it runs: it ships itself to workers by value, tyro reads its hints
    sys.modules[spec.name] = bench
    output = tmp_path / "ray_overhead.json"
    argv = ["--steps", "3", "--warmup", "1", "--rounds", "1", "--layouts", "2x2", "--obs", "rgb84"]
    try:
        spec.loader.exec_module(bench)
        result = bench.main([*argv, "--output", str(output)])
    finally:
        sys.modules.pop(spec.name, None)
    (row,) = result["rows"]
    assert (row["num_envs"], row["workers"], row["obs_bytes"]) == (2, 1, 84 * 84 * 3)
    assert row["ray_us_per_step"] > 0 and row["multiprocessing_us_per_step"] > 0
    assert output.exists() and ray.is_initialized()  # it used this Ray session, left it running


@pytest.mark.slow
def test_two_node_cluster_places_actors_by_resource_and_node(ray_sessions, make_pipelined):
    cluster = ray_sessions.two_nodes()
    head_id = cluster.head_node.node_id
    (worker_node,) = [n for n in cluster.worker_nodes]
    by_resource = make_pipelined(
        counting_fns(2, "box"),
        num_stages=2,
        backend="ray",
        ray_options={"num_cpus": 0.25, "resources": {"sim": 1}, "address": cluster.address},
    )
    assert ray.is_initialized()  # ray_options["address"] connected this driver
    nodes = ray.get([h.actor.node_id.remote() for h in by_resource.workers])
    assert nodes == [worker_node.node_id] * 2
    pinned = make_pipelined(
        counting_fns(2, "box"),
        num_stages=2,
        backend="ray",
        ray_options={"num_cpus": 0.25, "node_ids": [head_id, worker_node.node_id]},
    )
    assert ray.get([h.actor.node_id.remote() for h in pinned.workers]) == [
        head_id,
        worker_node.node_id,
    ]
    local = make_pipelined(counting_fns(2, "box"), num_stages=2)
    for envs in (by_resource, pinned):
        assert_tree_equal(envs.reset(seed=1), local.reset(seed=1))
        for t in range(5):
            assert_tree_equal(envs.step(acts(t % 3, 1)), local.step(acts(t % 3, 1)))
