"""Fault paths around restarts: start-up bounds, rebuilds, partial results, masked resets,
idle deaths, close and the fork context.

The vector envs here have 2 stages of 2 workers of 2 envs (8 envs); each test makes one
worker fail among several of its stage, in stage calls or whole-env calls, with shared
memory on and off. Bounds are generous (a hang shows as a pytest-timeout failure), never
tight timings.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path

import cloudpickle
import gymnasium as gym
import numpy as np
import psutil
import pytest

from pipelined_vec_env import (
    PipelinedVectorEnv,
    StageFailedError,
    WaitTimeoutError,
    WorkerCrashedError,
    make_vec,
)
from pipelined_vec_env.debug_envs import CountingEnv
from pipelined_vec_env.testing import kill_worker

# the env classes below travel to the workers by value (tests/ need not be importable there)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(120)

NUM_ENVS = 8  # 2 stages x 2 workers x 2 envs
LAYOUT = {"num_stages": 2, "envs_per_worker": 2}
VICTIM = 3  # worker 3 holds envs 6 and 7 (stage 1, beside worker 2)
RAISE, KILL = 1, 2  # ScriptedEnv actions


@pytest.fixture
def make_pipelined(make_pipelined):
    """These tests address workers by env (worker k owns env k): one env per worker unless
    a test asks for another layout (the default layout is tested in test_equivalence.py)."""
    return functools.partial(make_pipelined, envs_per_worker=1)


class ScriptedEnv(CountingEnv):
    """A CountingEnv that hangs where told: in its ``hang_builds``-th constructions (1 is
    the first; counted in a file per env id, across processes) or in every reset. Action
    `RAISE` raises, `KILL` SIGKILLs the worker, reset options ``{"boom": True}`` raise.

    Args:
        env_id: The env's id.
        log_dir: Folder for the build counts.
        hang_builds: Which constructions of this env hang (60 s).
        hang_reset: Every reset hangs (60 s).
        raise_build: The constructor raises.
        slow_rebuild: Each construction after the first takes this long (seconds) and
            logs its start and end wall times (`rebuild_spans`).
    """

    def __init__(
        self,
        env_id: int,
        log_dir: str,
        hang_builds: tuple[int, ...] = (),
        hang_reset: bool = False,
        raise_build: bool = False,
        slow_rebuild: float = 0.0,
    ) -> None:
        super().__init__(env_id, episode_length=100)
        if raise_build:
            raise RuntimeError(f"env {env_id} was told to fail in its constructor")
        log = Path(log_dir) / f"builds-{env_id}"
        with log.open("a") as f:
            f.write("b")
        builds = len(log.read_text())
        if builds in hang_builds:
            time.sleep(60)
        if slow_rebuild and builds > 1:
            started = time.time()
            time.sleep(slow_rebuild)
            with (Path(log_dir) / f"rebuilds-{env_id}").open("a") as f:
                f.write(f"{started} {time.time()}\n")
        self.hang_reset = hang_reset

    def reset(self, *, seed=None, options=None):
        if self.hang_reset:
            time.sleep(60)
        if options and options.get("boom"):
            raise ValueError(f"env {self.env_id} was told to raise in reset")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if action == RAISE:
            raise ValueError(f"env {self.env_id} was told to raise in step")
        if action == KILL:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


def scripted(tmp_path: Path, hang: dict[int, dict] | None = None) -> list:
    """Env fns for ``NUM_ENVS`` ScriptedEnvs; ``hang`` maps an env id to its hang kwargs."""
    tmp_path.mkdir(exist_ok=True)
    return [
        partial(ScriptedEnv, i, str(tmp_path), **(hang or {}).get(i, {})) for i in range(NUM_ENVS)
    ]


def zeros(n: int = NUM_ENVS) -> np.ndarray:
    return np.zeros(n, dtype=np.int64)


def descendants() -> set[psutil.Process]:
    return set(psutil.Process().children(recursive=True))


def assert_gone(procs: set[psutil.Process]) -> None:
    """Every process in ``procs`` exits within a generous 30 s."""
    _, alive = psutil.wait_procs(list(procs), timeout=30)
    assert not alive, f"processes left behind: {alive}"


# ---------------------------------------------------------------------- (1) start_timeout


def test_hanging_constructor_raises_wait_timeout_and_leaves_no_process(make_pipelined, tmp_path):
    make_pipelined(scripted(tmp_path / "warm"), **LAYOUT).close()  # forkserver + tracker up
    before = descendants()
    fns = scripted(tmp_path / "hang", {5: {"hang_builds": (1,)}})
    with pytest.raises(WaitTimeoutError, match="start_timeout") as info:
        PipelinedVectorEnv(fns, **LAYOUT, start_timeout=5.0)
    assert isinstance(info.value, TimeoutError) and "worker 2" in str(info.value)
    assert_gone(descendants() - before)


def test_constructor_error_is_raised_without_waiting_for_a_hung_sibling(make_pipelined, tmp_path):
    make_pipelined(scripted(tmp_path / "warm"), **LAYOUT).close()
    before = descendants()
    fns = scripted(tmp_path / "bad", {2: {"raise_build": True}, 5: {"hang_builds": (1,)}})
    with pytest.raises(RuntimeError, match="fail in its constructor"):
        PipelinedVectorEnv(fns, **LAYOUT)  # the default start_timeout (300 s) never matters
    assert_gone(descendants() - before)


class BarrierEnv(CountingEnv):
    """A CountingEnv whose constructor waits (up to 30 s) until every env of the vector
    env is being constructed: it can only finish if the workers start in parallel."""

    def __init__(self, env_id: int, log_dir: str, num_envs: int) -> None:
        super().__init__(env_id)
        (Path(log_dir) / f"started-{env_id}").touch()
        for _ in range(3000):
            if len(list(Path(log_dir).glob("started-*"))) == num_envs:
                return
            time.sleep(0.01)
        raise RuntimeError("the other workers did not start meanwhile")


def test_workers_start_in_parallel(make_pipelined, tmp_path):
    # envs_per_worker=1: 4 workers, each building one env that waits for the other three
    fns = [partial(BarrierEnv, i, str(tmp_path), 4) for i in range(4)]
    envs = make_pipelined(fns, num_stages=2, start_timeout=60.0)
    assert envs.reset(seed=0)[0].shape == (4, 3)


def test_start_timeout_is_a_vector_argument_of_make_vec(make_pipelined):
    # CartPole's constructor has no such argument: it must not reach gymnasium.make
    envs = make_vec("CartPole-v1", 2, start_timeout=30.0)
    try:
        assert envs.start_timeout == 30.0
        assert envs.spec.kwargs["vector_kwargs"]["start_timeout"] == 30.0
    finally:
        envs.close()
    for bad in (0, -1.0, float("inf"), None, True):
        with pytest.raises(ValueError, match="start_timeout"):
            PipelinedVectorEnv([CountingEnv], start_timeout=bad)


@pytest.mark.parametrize("whole", [False, True], ids=["stage", "whole"])
@pytest.mark.parametrize("max_restarts", [1, 2])
def test_rebuild_that_hangs_in_start_counts_as_a_failed_restart(
    make_pipelined, tmp_path, whole, max_restarts
):
    # env 6's second construction (the first rebuild of worker 3) hangs
    envs = make_pipelined(
        scripted(tmp_path, {6: {"hang_builds": (2,)}}),
        **LAYOUT,
        max_restarts=max_restarts,
        start_timeout=5.0,
    )
    envs.reset(seed=0)
    kill_worker(envs, VICTIM)
    if max_restarts == 1:  # the only restart hangs: the start-up timeout is raised
        with pytest.raises(WaitTimeoutError, match="start_timeout"):
            step(envs, whole)
        assert envs.restart_counts[VICTIM] == 1
        assert envs.workers[VICTIM].process.exitcode == -signal.SIGKILL  # killed and reaped
        return
    _, _, _, trunc, info = step(envs, whole)  # the second rebuild starts
    assert envs.restart_counts == (0, 0, 0, 2)
    expected = [False, False, True, True] if not whole else [False] * 6 + [True, True]
    assert trunc.tolist() == expected and info["worker_restarted"][-1]


def step(envs: PipelinedVectorEnv, whole: bool):
    """One step of stage 1 (whole=False) or of every env; results for the call's envs."""
    if whole:
        return envs.step(zeros())
    envs.step_async(zeros(4), stage=1)
    return envs.step_wait(stage=1)


def test_resets_inside_rebuilds_obey_step_deadline(make_pipelined, tmp_path):
    envs = make_pipelined(
        scripted(tmp_path, {7: {"hang_reset": True}}),
        **LAYOUT,
        max_restarts=2,
        step_deadline=2.0,
    )
    with pytest.raises(WorkerCrashedError, match="step_deadline") as info:
        envs.reset(seed=0)  # killed at 2 s, then twice more inside the two rebuilds
    assert info.value.worker_index == VICTIM and envs.restart_counts == (0, 0, 0, 2)


# ---------------------------------------------------------------------- (3) nothing lost


@pytest.mark.parametrize(
    "whole,shared_memory,bad",
    [(False, True, KILL), (True, False, KILL), (True, True, RAISE), (False, False, RAISE)],
    ids=["stage-shm-kill", "whole-pipe-kill", "whole-shm-raise", "stage-pipe-raise"],
)
def test_failed_step_keeps_the_healthy_envs_results(
    make_pipelined, tmp_path, whole, shared_memory, bad
):
    envs = make_pipelined(scripted(tmp_path), **LAYOUT, shared_memory=shared_memory)
    envs.reset(seed=0)
    actions = zeros()
    actions[7] = bad  # env 6, first in worker 3, has stepped when env 7 fails
    if whole:
        envs.step_async(actions)
    else:
        envs.step_async(actions[:4], stage=0)
        envs.step_async(actions[4:], stage=1)
    with pytest.raises(WorkerCrashedError if bad == KILL else ValueError) as info:
        envs.step_wait() if whole else envs.step_wait(stage=1)
    obs, rew, term, trunc, infos = info.value.partial_results
    ids = list(range(NUM_ENVS)) if whole else [4, 5, 6, 7]
    real = [g < 6 for g in ids]
    assert info.value.partial_mask.tolist() == real
    assert obs[:, 0].tolist() == ids  # the env ids
    assert obs[:, 1].tolist() == [1 if r else 0 for r in real]  # failed envs: last obs
    assert rew.tolist() == [1 + g / 100 if r else 0.0 for g, r in zip(ids, real, strict=True)]
    assert not term.any() and not trunc.any()
    assert infos["_count"].tolist() == real and set(infos["count"][np.array(real)]) == {1}
    # the other stage of a whole-env call is not failed, and its envs really stepped
    if not whole:
        envs.step_wait(stage=0)
    envs.step_async(zeros(4), stage=0)
    obs0, *_ = envs.step_wait(stage=0)
    assert obs0[:, 1].tolist() == [2, 2, 2, 2]


def test_failed_reset_keeps_the_healthy_envs_results(make_pipelined, tmp_path):
    envs = make_pipelined(scripted(tmp_path), **LAYOUT)
    options = [None] * NUM_ENVS
    options[6] = {"boom": True}
    with pytest.raises(ValueError, match="told to raise in reset") as info:
        envs.reset(seed=0, options=options)
    obs, rew, term, trunc, infos = info.value.partial_results
    real = [True] * 6 + [False, False]
    assert info.value.partial_mask.tolist() == real
    assert obs[:6, 0].tolist() == list(range(6)) and not rew.any() and not (term | trunc).any()
    assert infos["_env_id"].tolist() == real and infos["env_id"][:6].tolist() == list(range(6))
    envs.step_async(zeros(4), stage=0)  # stage 0 reset fine and steps
    assert envs.step_wait(stage=0)[0][:, 1].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "pipe"])
def test_decoupled_recv_delivers_healthy_results_across_a_crash(
    make_pipelined, tmp_path, shared_memory
):
    envs = make_pipelined(scripted(tmp_path), **LAYOUT, shared_memory=shared_memory)
    envs.async_reset(seed=0)
    assert envs.recv(batch_size=NUM_ENVS, timeout=30)[0].shape[0] == NUM_ENVS
    actions = zeros()
    actions[7] = KILL
    envs.send(actions, list(range(NUM_ENVS)))
    got: dict[int, int] = {}
    crashed = []
    while not crashed or len(got) < 6:  # the crash may be seen before or after any result
        try:
            obs, _, _, _, infos = envs.recv(timeout=30)
        except WorkerCrashedError as exc:
            crashed.append(exc.worker_index)
            continue
        for k, g in enumerate(infos["env_id"].tolist()):
            got[g] = int(obs[k, 1])
    assert crashed == [VICTIM] and got == {g: 1 for g in range(6)}
    # the healthy envs go on
    envs.send(zeros(6), list(range(6)))
    seen: dict[int, int] = {}
    while len(seen) < 6:
        obs, _, _, _, infos = envs.recv(timeout=30)
        seen.update(zip(infos["env_id"].tolist(), obs[:, 1].astype(int).tolist(), strict=True))
    assert seen == {g: 2 for g in range(6)}


# ---------------------------------------------------------------------- (2) masked resets


@pytest.mark.parametrize(
    "whole,shared_memory,bad",
    [(False, True, KILL), (True, False, RAISE)],
    ids=["stage-shm-kill", "whole-pipe-raise"],
)
def test_masked_reset_of_the_failed_envs_recovers_the_stage(
    make_pipelined, tmp_path, whole, shared_memory, bad
):
    envs = make_pipelined(scripted(tmp_path), **LAYOUT, shared_memory=shared_memory)
    envs.reset(seed=0)
    actions = zeros()
    actions[7] = bad
    with pytest.raises((WorkerCrashedError, ValueError)):
        envs.step(actions)
    n = NUM_ENVS if whole else 4
    stage = None if whole else 1

    def masked_reset(envs_to_reset):
        mask = np.zeros(n, dtype=np.bool_)
        mask[[g - (NUM_ENVS - n) for g in envs_to_reset]] = True
        envs.reset_async(options={"reset_mask": mask}, stage=stage)
        return envs.reset_wait(stage=stage)

    # only part of the failed worker's envs: a dead worker refuses it, a live one resets
    # env 7, and either way the stage stays failed
    if bad == KILL:
        with pytest.raises(WorkerCrashedError, match="includes all its envs"):
            masked_reset([7])
    else:
        masked_reset([7])
    with pytest.raises(StageFailedError, match="reset_mask"):
        step(envs, whole)
    obs, info = masked_reset([6, 7])
    assert info["_env_id"][-2:].all() and not info["_env_id"][:-2].any()
    _, rew, _, trunc, info = step(envs, whole)
    counts = [2] * (n - 2) + [1, 1]  # the other envs keep their episodes (two steps in)
    assert [int(r) for r in rew] == counts and not trunc.any()


# ---------------------------------------------------------------------- (4) idle deaths


@pytest.mark.parametrize(
    "whole,shared_memory,max_restarts",
    [(False, True, 0), (True, False, 1)],
    ids=["stage-shm-0", "whole-pipe-1"],
)
def test_reset_rebuilds_a_worker_that_died_while_idle(
    make_pipelined, tmp_path, whole, shared_memory, max_restarts
):
    envs = make_pipelined(
        scripted(tmp_path), **LAYOUT, shared_memory=shared_memory, max_restarts=max_restarts
    )
    envs.reset(seed=0)
    old_pid = envs.workers[VICTIM].process.pid
    kill_worker(envs, VICTIM)  # while idle: nothing is waiting on it
    if whole:
        obs, info = envs.reset(seed=1)
    else:
        envs.reset_async(seed=1, stage=1)
        obs, info = envs.reset_wait(stage=1)
    assert obs[-2:, 0].tolist() == [6, 7] and info["_env_id"].all()
    assert envs.workers[VICTIM].process.pid != old_pid
    assert envs.restart_counts == (0, 0, 0, 0)  # a reset's rebuild is not a restart
    _, rew, _, trunc, _ = step(envs, whole)
    assert not trunc.any() and [int(r) for r in rew] == [1] * len(rew)


# ---------------------------------------------------------------------- (5) close


class CloseProbeEnv(gym.Env):
    """Large observations (2 MiB float32) and a ``close`` that leaves a marker file, or
    hangs for 60 s.

    Args:
        env_id: The env's id (names its marker).
        log_dir: Folder for the markers.
        hang_close: ``close`` hangs instead.
    """

    def __init__(self, env_id: int, log_dir: str, hang_close: bool = False) -> None:
        self.env_id, self.log_dir, self.hang_close = env_id, log_dir, hang_close
        self.observation_space = gym.spaces.Box(0, 1, shape=(512, 1024), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), 0.0, False, False, {}

    def close(self):
        if self.hang_close:
            time.sleep(60)
        (Path(self.log_dir) / f"closed-{self.env_id}").touch()


def test_close_stops_all_workers_in_parallel_within_its_timeout(make_pipelined, tmp_path):
    # workers 0 and 1 hang in close; workers 2 and 3 are blocked sending an unread step
    fns = [partial(CloseProbeEnv, i, str(tmp_path), hang_close=i < 4) for i in range(NUM_ENVS)]
    envs = make_pipelined(fns, **LAYOUT, shared_memory=False)
    envs.reset(seed=0)
    envs.step_async(zeros())
    time.sleep(0.5)  # let the workers fill their pipes
    workers = {psutil.Process(h.process.pid) for h in envs.workers}
    timeout = 5.0
    start = time.monotonic()
    envs.close(timeout=timeout)
    elapsed = time.monotonic() - start
    # one after the other, four workers would take at least 4 * timeout
    assert elapsed < 3 * timeout, f"close took {elapsed:.1f} s"
    closed = sorted(p.name for p in tmp_path.glob("closed-*"))
    assert closed == [f"closed-{g}" for g in range(4, NUM_ENVS)]  # drained, then closed cleanly
    assert_gone(workers)


# ---------------------------------------------------------------------- (6) context="fork"

FORK_SCRIPT = """
import json, sys, time
from functools import partial
import numpy as np
from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.debug_envs import CountingEnv

envs = PipelinedVectorEnv(
    [partial(CountingEnv, i, 100, "dict") for i in range(8)],
    num_stages=2, envs_per_worker=2, context="fork", max_restarts=1,
)
names = envs.shared_memory_names
envs.reset(seed=0)
victim = envs.workers[3].process
victim.kill()
victim.join(30)
time.sleep(1.0)  # time for anything that would unlink the segments on the worker's death
envs.step_async(np.zeros(4, dtype=np.int64), stage=1)
_, _, _, trunc, _ = envs.step_wait(stage=1)
obs, *_ = envs.step(np.zeros(8, dtype=np.int64))
envs.close()
print(json.dumps({"names": names, "trunc": trunc.tolist(), "counts": obs["count"][:, 1].tolist(),
                  "restarts": list(envs.restart_counts)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and /dev/shm")
def test_fork_context_restarts_and_leaks_no_shared_memory(tmp_path):
    import json
    import subprocess

    script = tmp_path / "fork_run.py"
    script.write_text(FORK_SCRIPT)
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert run.returncode == 0, run.stderr
    assert "leaked" not in run.stderr and "resource_tracker" not in run.stderr, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["trunc"] == [False, False, True, True] and out["restarts"] == [0, 0, 0, 1]
    assert out["counts"] == [1, 1, 1, 1, 2, 2, 0, 0]  # worker 3 restarted, then autoreset
    assert out["names"] and not [n for n in out["names"] if Path("/dev/shm", n).exists()]


# ---------------------------------------------------------------------- (7) rebuilt together


def rebuild_spans(log_dir: Path, env_ids: tuple[int, ...]) -> list[tuple[float, float]]:
    """Each rebuild of the worker of ``env_ids`` (its envs built one after another): the
    wall-clock span from its first env's construction start to its last one's end."""
    logs = [(log_dir / f"rebuilds-{g}").read_text().split() for g in env_ids]
    starts, ends = logs[0][0::2], logs[-1][1::2]
    return [(float(a), float(b)) for a, b in zip(starts, ends, strict=True)]


def assert_rebuilt_together(log_dir: Path, workers: list[tuple[int, ...]]) -> None:
    """The workers of ``workers`` (their env ids) were rebuilt once each, and their envs'
    constructions overlapped: every rebuild started before any of them ended (one after
    another, each would start only once the one before had built its envs and reset)."""
    spans = [rebuild_spans(log_dir, ids) for ids in workers]
    assert all(len(s) == 1 for s in spans), spans
    starts, ends = [s[0][0] for s in spans], [s[0][1] for s in spans]
    assert max(starts) < min(ends), f"rebuilds one after another: {spans}"


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "stage"])
def test_workers_that_fail_in_one_call_are_rebuilt_together(make_pipelined, tmp_path, whole):
    """Two workers killed in one call (a whole-env step, or a stage's step with both its
    workers) restart together: their slow env constructions (1 s each) overlap."""
    envs = make_pipelined(
        scripted(tmp_path, {g: {"slow_rebuild": 1.0} for g in range(NUM_ENVS)}),
        **LAYOUT,
        max_restarts=1,
    )
    envs.reset(seed=0)
    actions = zeros()
    if whole:
        actions[[1, 6]] = KILL  # worker 0 (stage 0) and worker 3 (stage 1)
        _, _, _, trunc, info = envs.step(actions)
        restarted, rebuilt = [0, 1, 6, 7], [(0, 1), (6, 7)]
    else:
        actions[[4, 7]] = KILL  # both workers of stage 1
        envs.step_async(actions[4:], stage=1)
        _, _, _, trunc, info = envs.step_wait(stage=1)
        restarted, rebuilt = [0, 1, 2, 3], [(4, 5), (6, 7)]
    assert np.flatnonzero(trunc).tolist() == restarted
    assert np.flatnonzero(info["_worker_restarted"]).tolist() == restarted
    counts = [0] * 4
    for ids in rebuilt:
        counts[ids[0] // 2] = 1
    assert envs.restart_counts == tuple(counts)
    assert_rebuilt_together(tmp_path, rebuilt)
    assert not step(envs, whole)[3].any()  # the rebuilt workers step on


def test_a_reset_rebuilds_its_dead_workers_together(make_pipelined, tmp_path):
    """Two workers that died while idle are rebuilt together by the next reset."""
    envs = make_pipelined(
        scripted(tmp_path, {g: {"slow_rebuild": 1.0} for g in range(NUM_ENVS)}), **LAYOUT
    )
    envs.reset(seed=0)
    kill_worker(envs, 0)
    kill_worker(envs, VICTIM)
    obs, info = envs.reset(seed=1)
    assert obs[:, 0].tolist() == list(range(NUM_ENVS)) and info["_env_id"].all()
    assert envs.restart_counts == (0, 0, 0, 0)  # a reset's rebuild is not a restart
    assert_rebuilt_together(tmp_path, [(0, 1), (6, 7)])
