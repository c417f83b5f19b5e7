"""A worker steps its envs concurrently on threads when their steps wait off the CPU, and
one after another otherwise (`pipelined_vec_env.workers.step_profile`): the decision, its
visibility, the env's own say (``metadata["step_concurrency"]``), and trajectories equal
to serial stepping for the same seeds, whole-env and decoupled, in both autoreset modes.
No wall-clock assertion: only which thread stepped each env and what the worker says."""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from pipelined_vec_env.debug_envs import BusyEnv, CountingEnv, FaultyEnv
from pipelined_vec_env.workers.step_profile import (
    OFF_CPU_SHARE,
    WARM_SECONDS,
    WINDOW_STEPS,
    declared_concurrency,
    off_cpu_share,
    steps_concurrently,
)
from tests.conftest import assert_tree_equal

LENGTHS = [2, 3, 4, 5]
# steps that cover the two measurement windows of a 4-env worker, and more
STEPS = 2 * WINDOW_STEPS // len(LENGTHS) + 6


class NappingEnv(CountingEnv):
    """`CountingEnv` whose step first sleeps ``nap`` seconds (off the CPU, as a render or a
    remote simulator would), recording the thread that stepped it; ``declared`` sets
    ``metadata["step_concurrency"]``."""

    def __init__(
        self, env_id: int, episode_length: int, nap: float = 0.003, declared: Any = None
    ) -> None:
        super().__init__(env_id, episode_length)
        self.nap = nap
        self.stepped_on = ""
        if declared is not None:
            self.metadata = {**self.metadata, "step_concurrency": declared}

    def step(self, action: Any):
        self.stepped_on = threading.current_thread().name
        time.sleep(self.nap)
        return super().step(action)


class BusyThreadEnv(BusyEnv):
    """`BusyEnv` (CPU-bound steps) recording the thread that stepped it."""

    stepped_on = ""

    def step(self, action: Any):
        self.stepped_on = threading.current_thread().name
        return super().step(action)


def napping_fns(declared: Any = None, nap: float = 0.003) -> list:
    return [
        partial(NappingEnv, i, LENGTHS[i], nap=nap, declared=declared) for i in range(len(LENGTHS))
    ]


def run_steps(envs: Any, steps: int) -> list:
    trace = [envs.reset(seed=7)]
    time.sleep(WARM_SECONDS)  # the workers count no measurement before (native thread pools)
    for t in range(steps):
        trace.append(envs.step(np.array([(t + i) % 3 for i in range(envs.num_envs)])))
    return trace


def test_the_rule_counts_off_cpu_time_without_the_waits_for_a_core():
    assert off_cpu_share(cpu=1.0, wall=4.0) == pytest.approx(0.75)
    assert off_cpu_share(cpu=1.0, wall=4.0, waited=2.0) == pytest.approx(0.25)
    assert off_cpu_share(cpu=0.0, wall=0.0) == 0.0
    assert steps_concurrently(cpu=0.1, wall=1.0)
    assert not steps_concurrently(cpu=0.1, wall=1.0, waited=0.8)  # a busy host, not a wait
    assert not steps_concurrently(cpu=1 - OFF_CPU_SHARE, wall=1.0)
    assert declared_concurrency([{}, {"step_concurrency": "concurrent"}]) is None
    assert declared_concurrency([{"step_concurrency": "concurrent"}] * 2) == "concurrent"
    assert (
        declared_concurrency([{"step_concurrency": "concurrent"}, {"step_concurrency": "serial"}])
        == "serial"
    )
    with pytest.raises(ValueError, match="step_concurrency"):
        declared_concurrency([{"step_concurrency": "threads"}])


def test_envs_that_wait_off_the_cpu_step_concurrently_and_say_why(make_pipelined):
    envs = make_pipelined(napping_fns(), envs_per_worker=4)
    before = envs.step_profiles()
    assert [p["stepping"] for p in before] == ["serial"] * 4
    assert before[0]["reason"] == "not measured yet"
    run_steps(envs, STEPS)
    profiles = envs.step_profiles()
    assert [p["stepping"] for p in profiles] == ["concurrent"] * 4
    assert profiles[0]["reason"].startswith("measured")
    assert profiles[0]["off_cpu_share"] > OFF_CPU_SHARE and profiles[0]["envs_in_worker"] == 4
    threads = envs.get_attr("stepped_on")
    assert all(name.startswith("env-step") for name in threads), threads


def test_cpu_bound_envs_stay_serial(make_pipelined):
    fns = [partial(BusyThreadEnv, step_seconds=0.001, obs_dim=4) for _ in range(4)]
    envs = make_pipelined(fns, envs_per_worker=4)
    envs.reset(seed=0)
    time.sleep(WARM_SECONDS)
    actions = np.zeros((4, *envs.single_action_space.shape), dtype=np.float32)
    for _ in range(STEPS):
        envs.step(actions)
    profiles = envs.step_profiles()
    assert [p["stepping"] for p in profiles] == ["serial"] * 4
    assert profiles[0]["reason"].startswith("measured")
    assert profiles[0]["off_cpu_share"] <= OFF_CPU_SHARE
    assert set(envs.get_attr("stepped_on")) == {"MainThread"}


@pytest.mark.parametrize("declared", ["serial", "concurrent"])
def test_an_env_can_say_how_it_is_stepped(make_pipelined, declared):
    envs = make_pipelined(napping_fns(declared), envs_per_worker=4)
    run_steps(envs, 3)
    profiles = envs.step_profiles()
    assert [p["stepping"] for p in profiles] == [declared] * 4
    assert profiles[0]["declared"] == declared and "metadata" in profiles[0]["reason"]
    on_threads = [name.startswith("env-step") for name in envs.get_attr("stepped_on")]
    assert on_threads == [declared == "concurrent"] * 4


def test_an_unknown_declaration_is_an_error_naming_the_key():
    from pipelined_vec_env import PipelinedVectorEnv

    with pytest.raises(ValueError, match=r"step_concurrency.*'serial' or 'concurrent'"):
        PipelinedVectorEnv(napping_fns("threads"), envs_per_worker=4)


def test_an_explicit_envs_per_worker_is_honoured(make_pipelined):
    envs = make_pipelined(napping_fns(), envs_per_worker=2)
    assert [w.env_indices for w in envs.workers] == [(0, 1), (2, 3)]
    run_steps(envs, STEPS)
    assert [p["envs_in_worker"] for p in envs.step_profiles()] == [2] * 4


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("declared", [None, "concurrent"])
def test_concurrent_steps_give_the_serial_trajectories(make_pipelined, mode, declared):
    # measured (declared None): naps long enough that a loaded host's wake-up delays stay
    # a small part of each step, so the decision is "concurrent" on any host
    nap = 0.001 if declared else 0.005
    serial = make_pipelined(napping_fns("serial", nap=nap), envs_per_worker=4, autoreset_mode=mode)
    ours = make_pipelined(napping_fns(declared, nap=nap), envs_per_worker=4, autoreset_mode=mode)
    assert_tree_equal(run_steps(ours, STEPS), run_steps(serial, STEPS))
    assert [p["stepping"] for p in ours.step_profiles()] == ["concurrent"] * 4


def _decoupled_trace(envs: Any, sends: int) -> dict[int, list]:
    """Per env, what ``recv`` returned for it, over ``sends`` rounds of ``recv(2)``/``send``
    (the envs' order of arrival depends on timing; each env's own sequence does not)."""
    per_env: dict[int, list] = {i: [] for i in range(envs.num_envs)}
    envs.async_reset(seed=11)
    for _ in range(sends):
        obs, rewards, terms, truncs, info = envs.recv(batch_size=2)
        ids = info["env_id"]
        for k, i in enumerate(ids):
            per_env[int(i)].append((obs[k].copy(), rewards[k], terms[k], truncs[k]))
        envs.send(np.array([(int(i) + len(per_env[int(i)])) % 3 for i in ids]), ids)
    return per_env


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_concurrent_recv_send_gives_the_serial_trajectories(make_pipelined, mode):
    serial = make_pipelined(
        napping_fns("serial", nap=0.001), envs_per_worker=4, autoreset_mode=mode
    )
    ours = make_pipelined(
        napping_fns("concurrent", nap=0.001), envs_per_worker=4, autoreset_mode=mode
    )
    expected, got = _decoupled_trace(serial, STEPS), _decoupled_trace(ours, STEPS)
    for i in range(len(LENGTHS)):
        n = min(len(expected[i]), len(got[i]))
        assert n >= 2
        assert_tree_equal(got[i][:n], expected[i][:n], path=f"env {i}")


class SlowOrRaisingEnv(NappingEnv):
    """A `NappingEnv` declared concurrent whose step raises ``ValueError`` on action 2, and
    otherwise naps ``nap`` seconds then writes ``done_file``."""

    def __init__(self, env_id: int, nap: float, done_file: Path) -> None:
        super().__init__(env_id, 100, nap=nap, declared="concurrent")
        self.done_file = done_file

    def step(self, action: Any):
        if int(action) == 2:
            raise ValueError("no such action")
        result = super().step(action)
        self.done_file.write_text("stepped")
        return result


def test_a_failed_concurrent_step_is_answered_once_every_other_env_is_done(
    make_pipelined, tmp_path
):
    done = tmp_path / "env1"
    fns = [
        partial(SlowOrRaisingEnv, 0, 0.0, tmp_path / "env0"),
        partial(SlowOrRaisingEnv, 1, 0.3, done),
    ]
    envs = make_pipelined(fns, envs_per_worker=2)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="no such action"):
        envs.step(np.array([2, 0]))
    assert done.exists()  # env 1's step ended before the error came back


def test_a_worker_that_sleeps_from_its_first_steps_is_measured_off_the_cpu(make_pipelined):
    """Envs of the package (imported by the worker at its start: nothing slow to load)
    that only sleep, stepped from the worker's first moments: the measurement waits for
    the worker's set-up to settle (a capped OpenBLAS starts a server thread that spins for
    about 0.1 s, which made such envs look CPU-bound), then finds them off the CPU."""
    envs = make_pipelined([partial(FaultyEnv, sleep_seconds=0.002)] * 2, envs_per_worker=2)
    envs.reset(seed=0)
    deadline = time.monotonic() + WARM_SECONDS + 10.0
    while envs.step_profiles()[0]["reason"] == "not measured yet":
        assert time.monotonic() < deadline, "no decision"
        envs.step(np.full(2, FaultyEnv.SLEEP))
    profile = envs.step_profiles()[0]
    assert profile["stepping"] == "concurrent", profile
    assert profile["off_cpu_share"] > OFF_CPU_SHARE


def test_the_decision_is_logged_at_debug_level(caplog):
    from pipelined_vec_env.workers.step_profile import StepProfile

    envs = [NappingEnv(i, 100, nap=0.002) for i in range(2)]
    for env in envs:
        env.reset(seed=0)
    profile = StepProfile(envs, (4, 5), warm_seconds=0.0)
    with caplog.at_level("DEBUG", logger="pipelined_vec_env.workers.step_profile"):
        for _ in range(2 * WINDOW_STEPS // 2):
            profile.run(lambda k: envs[k].step(0), 2)
    profile.close()
    assert profile.mode == "concurrent"
    assert any(
        "envs (4, 5): stepping concurrent (measured:" in r.getMessage() for r in caplog.records
    )


class GatedEnv(NappingEnv):
    """A `NappingEnv` declared concurrent whose step, unless ``quick``, first waits (at
    most 30 s) until ``gate`` exists: its step ends only once the test says so."""

    def __init__(self, env_id: int, gate: Path, quick: bool) -> None:
        super().__init__(env_id, 100, nap=0.0, declared="concurrent")
        self.gate, self.quick = gate, quick

    def step(self, action: Any):
        deadline = time.monotonic() + 30.0
        while not self.quick and not self.gate.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        return super().step(action)


def test_recv_returns_a_concurrent_workers_envs_as_each_finishes(make_pipelined, tmp_path):
    # envs 0, 1, 3 step only once the gate opens; env 2 at once: sent together to one
    # worker, env 2 comes back alone, before the others are done
    gate = tmp_path / "gate"
    fns = [partial(GatedEnv, i, gate, quick=i == 2) for i in range(4)]
    envs = make_pipelined(fns, envs_per_worker=4)
    envs.async_reset(seed=3)
    *_, info = envs.recv(batch_size=4)
    envs.send(np.zeros(4, dtype=np.int64), info["env_id"])
    *_, info = envs.recv(batch_size=1, timeout=20.0)
    assert info["env_id"].tolist() == [2]
    envs.send(np.zeros(1, dtype=np.int64), info["env_id"])  # again, while the others step
    *_, info = envs.recv(batch_size=1, timeout=20.0)
    assert info["env_id"].tolist() == [2]
    gate.write_text("open")
    got = []
    while len(got) < 3:
        *_, info = envs.recv(batch_size=1, timeout=20.0)
        got.extend(info["env_id"].tolist())
    assert sorted(got) == [0, 1, 3]
    # the worker's next plain command is answered as before
    assert list(envs.get_attr("quick")) == [False, False, True, False]


def test_env_steps_count_toward_the_next_serial_measurement():
    from pipelined_vec_env.workers.step_profile import REVISIT_BATCHES, StepProfile

    envs = [NappingEnv(i, 100, nap=0.002) for i in range(2)]
    for env in envs:
        env.reset(seed=0)
    profile = StepProfile(envs, (0, 1), warm_seconds=0.0)
    for _ in range(2 * WINDOW_STEPS // 2):
        profile.run(lambda k: envs[k].step(0), 2)
    assert profile.concurrent_now()
    for _ in range(REVISIT_BATCHES + 1):  # decoupled single-env steps
        profile.count_env_step()
    assert not profile.concurrent_now()  # the caller sends whole commands: measured again
    profile.run(lambda k: envs[k].step(0), 2)
    assert profile.mode == "concurrent" and profile.window[3] == 2  # in a serial window
    profile.close()
