"""``--num-stages auto``: the trainer runs tune() with its own inference, prints the choice
and its table, trains with it and saves it in config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference_trainer.config import TrainConfig
from reference_trainer.train import train

from .conftest import tiny_train_config

tyro = pytest.importorskip("tyro")


def test_cli_accepts_auto_and_ints():
    assert tyro.cli(TrainConfig, args=["--num-stages", "auto"]).num_stages == "auto"
    assert tyro.cli(TrainConfig, args=["--num-stages", "3"]).num_stages == 3


@pytest.mark.timeout(240)
def test_tiny_run_with_auto_layout_prints_and_saves_the_choice(tmp_path: Path, capsys):
    config = tiny_train_config(
        tmp_path,
        num_stages="auto",
        tune_seconds=15.0,
    )
    summary = train(config)

    out = capsys.readouterr().out
    assert "--num-stages auto: tune chose" in out and "predicted" in out and "measured" in out
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    layout = saved["auto_layout"]
    assert saved["num_stages"] in (1, 2) and saved["num_stages"] == layout["kwargs"]["num_stages"]
    assert saved["envs_per_worker"] == layout["kwargs"]["envs_per_worker"]
    assert saved["decoupled"] == (layout["mode"] == "decoupled")
    assert layout["choice"] in out and layout["seconds"] < 15.0 + 10
    assert {row["name"] for row in layout["table"]} >= {"staged 1x1", "staged 2x1", "decoupled b=1"}
    assert any(row["measured"] for row in layout["table"])
    assert summary["global_step"] == 64 and summary["num_stages"] == saved["num_stages"]
