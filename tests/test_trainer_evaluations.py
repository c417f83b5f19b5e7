"""Held-out evaluations of a trainer run: full ones before and after training, a subset of
the same episodes during it, the deadline planning that makes room for both, and the
assignment of evaluation episodes to the envs."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from reference_trainer.config import TrainConfig
from reference_trainer.train import train

from .conftest import tiny_train_config


def _config(tmp_path: Path, **overrides) -> TrainConfig:
    config = tiny_train_config(tmp_path, eval_at_start=True, eval_episodes=4)
    return dataclasses.replace(config, **overrides)


@pytest.mark.parametrize("decoupled", [False, True])
def test_evaluations_during_training_play_the_first_episodes_and_land_in_the_summary(
    tmp_path, decoupled
):
    summary = train(
        _config(
            tmp_path,
            eval_every=1,
            eval_during_episodes=2,
            total_timesteps=96,
            decoupled=decoupled,
        )
    )
    on_disk = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    evaluations = on_disk["evaluations"]
    # before (full), after iterations 1 and 2 (subsets; none after the last), after (full)
    assert [e["iteration"] for e in evaluations] == [0, 1, 2, 3]
    assert [int(e["episodes"]) for e in evaluations] == [4, 2, 2, 4]
    assert [e["subset"] for e in evaluations] == [False, True, True, False]
    assert on_disk["eval_episodes"] == 4 and on_disk["final_eval"]["episodes"] == 4
    assert all(e["video"] is None for e in evaluations)


def test_zero_means_every_episode_during_training_too(tmp_path):
    summary = train(_config(tmp_path, eval_every=1, total_timesteps=64))
    assert [int(e["episodes"]) for e in summary["evaluations"]] == [4, 4, 4]
    assert not any(e["subset"] for e in summary["evaluations"])


def test_a_negative_subset_is_refused(tmp_path):
    with pytest.raises(ValueError, match="eval_during_episodes"):
        train(_config(tmp_path, eval_during_episodes=-1))


def test_subset_evaluations_never_run_past_the_deadline(tmp_path):
    """Evaluations due after every iteration (``eval_every_minutes`` tiny) with a
    deadline (the trainer keeps 5 s spare): training stops in time for the last subset
    and the final evaluation."""
    budget_s = 12.0
    start = time.time()
    summary = train(
        _config(
            tmp_path,
            deadline=start + budget_s,
            eval_every_minutes=1e-6,
            eval_during_episodes=2,
            total_timesteps=10**7,
            eval_video_s=0.5,
        )
    )
    assert time.time() <= start + budget_s
    assert summary["stopped_early"]
    during = summary["evaluations"][1:-1]
    assert during, "no evaluation during training"
    assert all(int(e["episodes"]) == 2 and e["subset"] for e in during)
