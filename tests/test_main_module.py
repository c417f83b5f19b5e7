"""Envs, ids and info classes defined in the caller's `__main__` script work in the workers
(as with gymnasium's `AsyncVectorEnv` under the same start method), and a worker loads the
script only when it needs something from it. Each test runs a real script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]

PREAMBLE = """
import multiprocessing as mp
import os
import sys
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from pipelined_vec_env import PipelinedVectorEnv, make_vec

if __name__ == "__mp_main__" and os.environ.get("LOAD_MARKER"):
    with open(os.environ["LOAD_MARKER"], "a") as f:  # this script ran in a worker
        f.write(f"{os.getpid()}\\n")


@dataclass
class Marker:
    value: int


class MyEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {"marker": Marker(-1)}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, False, False, {"marker": Marker(int(action))}


gym.register("ScriptEnv-v0", entry_point=MyEnv)
gym.register("ScriptEnvByName-v0", entry_point="__main__:MyEnv")
"""


def run_script(tmp_path: Path, body: str, *args: str) -> tuple[str, list[str]]:
    """Run PREAMBLE + body as a script; return its stdout and the pids that loaded it."""
    script = tmp_path / "train_script.py"
    script.write_text(PREAMBLE + textwrap.dedent(body))
    marker = tmp_path / "loads.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOAD_MARKER": str(marker)}
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loads = marker.read_text().split() if marker.exists() else []
    return done.stdout, loads


@pytest.mark.parametrize("context", ["forkserver", "spawn"])
def test_ids_registered_in_the_script(tmp_path, context):
    out, loads = run_script(
        tmp_path,
        """
        if __name__ == "__main__":
            ctx = sys.argv[1]
            envs = PipelinedVectorEnv([lambda: gym.make("ScriptEnv-v0")] * 2, context=ctx)
            obs, _ = envs.reset(seed=0)  # was NameNotFound in the workers
            envs.close()
            envs = make_vec("ScriptEnvByName-v0", 2, vector_kwargs={"context": ctx})
            obs, _ = envs.reset(seed=0)  # was AttributeError: no MyEnv on __main__
            envs.close()
            print("ok", obs.shape)
    """,
        context,
    )
    assert "ok (2, 1)" in out
    assert len(loads) == 4  # each worker loaded the script once, when it needed it


@pytest.mark.parametrize("context", ["forkserver", "spawn", "fork"])
def test_info_objects_of_script_classes(tmp_path, context):
    out, loads = run_script(
        tmp_path,
        """
        if __name__ == "__main__":
            envs = PipelinedVectorEnv([MyEnv] * 2, context=sys.argv[1])
            _, info = envs.reset(seed=0)
            _, _, _, _, info = envs.step(np.array([1, 0]))  # was PicklingError
            assert all(isinstance(m, Marker) for m in info["marker"]), info
            print("ok", [m.value for m in info["marker"]])
            envs.close()
    """,
        context,
    )
    assert "ok [1, 0]" in out


@pytest.mark.parametrize("context", ["forkserver", "spawn"])
def test_the_script_run_inside_a_spawned_child(tmp_path, context):
    out, _ = run_script(
        tmp_path,
        """
        def train(ctx):
            envs = PipelinedVectorEnv([MyEnv] * 2, context=ctx)  # MyEnv is __mp_main__.MyEnv
            envs.reset(seed=0)  # was "Can't get attribute 'MyEnv' on <module '__main__'>"
            envs.step(np.zeros(2, np.int64))
            envs.close()
            print("ok in child", flush=True)

        if __name__ == "__main__":
            child = mp.get_context("spawn").Process(target=train, args=(sys.argv[1],))
            child.start()
            child.join()
            sys.exit(child.exitcode)
    """,
        context,
    )
    assert "ok in child" in out


def test_workers_that_need_nothing_from_the_script_do_not_load_it(tmp_path):
    out, loads = run_script(
        tmp_path,
        """
        if __name__ == "__main__":
            envs = PipelinedVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
            envs.reset(seed=0)
            envs.step(np.zeros(2, np.int64))
            envs.close()
            print("ok")
    """,
    )
    assert "ok" in out
    assert loads == []
