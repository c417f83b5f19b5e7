"""CleanRL-style scripts run on PipelinedVectorEnv, and their episode logging is right.

The example scripts run with tiny budgets through their ``main(args)`` (arguments parsed
by the scripts' own tyro ``Args``). Each returns the episodes it logged from
``infos["episode"]`` and what ``RecordEpisodeStatistics`` recorded inside every env; the
two must agree exactly, episode by episode.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import gymnasium as gym
import numpy as np
import pytest

from tests.conftest import assert_tree_equal

from .conftest import load_script

pytest.importorskip("torch")
pytest.importorskip("tyro")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY = [
    "--env-id",
    "Pendulum-v1",
    "--max-episode-steps",
    "30",
    "--num-envs",
    "2",
    "--num-steps",
    "48",
    "--total-timesteps",
    "192",  # 2 rollouts; episodes end inside and across them
    "--num-minibatches",
    "2",
    "--update-epochs",
    "1",
]


def load_example(name: str) -> ModuleType:
    return load_script(f"examples/{name}.py", f"example_{name}")


def check_logged_episodes(result: dict, num_envs: int, episode_length: int) -> None:
    logged: list[list[float]] = [[] for _ in range(num_envs)]
    for episode in result["episodes"]:
        logged[episode["env"]].append(episode["return"])
        assert episode["length"] == episode_length
    assert logged == result["recorded_returns"]
    assert all(len(returns) >= 2 for returns in logged)  # some episodes end in the 2nd rollout
    assert result["recorded_lengths"] == [[episode_length] * len(r) for r in logged]
    steps = [e["global_step"] for e in result["episodes"]]
    assert steps == sorted(steps)


SCRIPT = "cleanrl_ppo_continuous_action"


@pytest.mark.parametrize("extra", [[], ["--num-stages", "2"]], ids=["plain", "staged-2"])
def test_example_logs_record_episode_statistics_values(extra, tmp_path):
    module = load_example(SCRIPT)
    log = tmp_path / "episodes.json"
    args = module.tyro.cli(module.Args, args=[*TINY, *extra, "--episode-log", str(log)])
    result = module.main(args)
    check_logged_episodes(result, num_envs=2, episode_length=30)
    assert log.exists()


def test_a_budget_too_small_for_one_episode_says_so(capsys):
    module = load_example(SCRIPT)
    short = [*TINY[:2], "--max-episode-steps", "500", *TINY[4:]]
    args = module.tyro.cli(module.Args, args=[*short, "--total-timesteps", "96"])
    result = module.main(args)
    assert (
        result["episodes"] == []
        and "no episode finished within 96 env steps" in capsys.readouterr().out
    )


def test_one_stage_of_the_staged_loop_matches_the_plain_loop(monkeypatch):
    """The staged rollout loop over one stage is the plain loop: same episodes, same returns.

    ``--num-stages 1`` selects the plain ``envs.step`` loop, so the staged loop is run
    over a single stage by asking for 2 stages and building the envs with one.
    """
    from pipelined_vec_env import PipelinedVectorEnv

    plain = load_example(SCRIPT)
    want = plain.main(plain.tyro.cli(plain.Args, args=TINY))

    staged = load_example(SCRIPT)
    built = []

    def one_stage_envs(env_fns, num_stages):
        assert num_stages == 2
        built.append(PipelinedVectorEnv(env_fns, num_stages=1))
        return built[-1]

    monkeypatch.setattr(staged, "PipelinedVectorEnv", one_stage_envs)
    got = staged.main(staged.tyro.cli(staged.Args, args=[*TINY, "--num-stages", "2"]))
    assert [envs.num_stages for envs in built] == [1]
    check_logged_episodes(got, num_envs=2, episode_length=30)
    assert got == want


def strip_episode_time(infos: dict) -> dict:
    if "episode" in infos:
        infos = dict(infos)
        infos["episode"] = {k: v for k, v in infos["episode"].items() if k != "t"}
    return infos


def test_lambda_wrappers_match_sync_vector_env(make_pipelined):
    """Wrappers built in lambdas (cloudpickled into workers) give SyncVectorEnv's results."""

    def fns() -> list:
        return [
            lambda i=i: gym.wrappers.TransformObservation(
                gym.wrappers.NormalizeObservation(
                    gym.wrappers.RecordEpisodeStatistics(
                        gym.make("Pendulum-v1", max_episode_steps=5 + i)
                    )
                ),
                lambda obs: np.clip(obs, -0.5, 0.5),
                None,
            )
            for i in range(3)
        ]

    from pipelined_vec_env import PipelinedVectorEnv

    ours: PipelinedVectorEnv = make_pipelined(fns(), num_stages=2)
    ref = gym.vector.SyncVectorEnv(fns())
    try:
        names = [w.name for w in ref.envs[0].spec.additional_wrappers]
        assert [w.name for w in ours.env_spec.additional_wrappers] == names
        assert "TransformObservation" in names  # its kwargs hold a lambda
        assert_tree_equal(ours.reset(seed=0), ref.reset(seed=0))
        rng = np.random.default_rng(0)
        for _ in range(14):
            actions = rng.uniform(-2, 2, size=(3, 1)).astype(np.float32)
            *got, got_infos = ours.step(actions)
            *want, want_infos = ref.step(actions)
            assert_tree_equal(got, want)
            assert_tree_equal(strip_episode_time(got_infos), strip_episode_time(want_infos))
        assert [list(q) for q in ours.get_attr("return_queue")] == [
            list(q) for q in ref.get_attr("return_queue")
        ]
    finally:
        ref.close()
