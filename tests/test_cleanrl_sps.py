"""``benchmarks/cleanrl_sps.py``: its patches of CleanRL's script and its SPS parsing.

The benchmark itself runs CleanRL's script (not in this repository); these tests check the
parts that decide what runs: every patch applies exactly once or stops the benchmark with
the text it looked for, and the SPS read is CleanRL's last ``SPS:`` line.
"""

from __future__ import annotations

import pytest

from tests.conftest import load_script

# the lines of the script the patches replace, in its layout (a stand-in, not the script)
SCRIPT = """import gymnasium as gym
import numpy as np

def make_env(env_id):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))
        return env
    return thunk

if __name__ == "__main__":
    envs = gym.vector.SyncVectorEnv(
        [make_env("Pendulum-v1") for i in range(2)]
    )
    for step in range(3):
            infos = {}
            if "final_info" in infos:
                for info in infos["final_info"]:
                    pass
"""


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/cleanrl_sps.py", "benchmarks_cleanrl_sps")


def test_variants_differ_in_the_vector_env_line_and_its_import_only(bench):
    sync = bench.patched(SCRIPT, bench.VARIANTS["SyncVectorEnv"])
    ours = bench.patched(SCRIPT, bench.VARIANTS["PipelinedVectorEnv(env_fns)"])
    assert "env.observation_space)" in sync and 'infos["_episode"]' in sync
    removed = set(sync.splitlines()) - set(ours.splitlines())
    added = set(ours.splitlines()) - set(sync.splitlines())
    assert removed == {"    envs = gym.vector.SyncVectorEnv("}
    assert added == {
        "    envs = PipelinedVectorEnv(",
        "from pipelined_vec_env import PipelinedVectorEnv",
    }
    compile(ours, "ppo_continuous_action.py", "exec")  # still Python


def test_a_patch_that_does_not_match_names_itself(bench):
    changed = SCRIPT.replace("gym.vector.SyncVectorEnv(", "gym.vector.AsyncVectorEnv(")
    with pytest.raises(ValueError, match="the vector env line"):
        bench.patched(changed, bench.VARIANTS["PipelinedVectorEnv(env_fns)"])


def test_sps_is_the_last_sps_line(bench):
    out = "global_step=8, episodic_return=[1.0]\nSPS: 120\nSPS: 345\nbye\n"
    assert bench.sps_of(out) == 345
    with pytest.raises(ValueError, match="no 'SPS: N' line"):
        bench.sps_of("global_step=8\n")
