"""The trainer's --profile: a tiny run writes the trace, the timeline and the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference_trainer.train import train

from .conftest import tiny_train_config

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("decoupled", [False, True])
def test_profile_writes_trace_timeline_and_summary(tmp_path, capsys, decoupled):
    config = tiny_train_config(
        tmp_path,
        decoupled=decoupled,
        profile=True,
    )
    train(config)
    run_dir = Path(tmp_path / "run")
    trace = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    inference = [e for e in trace if e["ph"] == "X" and e["name"] == "inference"]
    steps = [e for e in trace if e["ph"] == "X" and e["name"] == "step" and e["cat"] == "command"]
    # two rollouts of 16 decisions in 2 envs: every decision is one step command
    assert len(steps) == 2 * 16 * 2
    assert inference
    assert (run_dir / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    profile = json.loads((run_dir / "profile.json").read_text())
    assert profile["bottleneck"] in ("env", "policy", "transport", "straggler")
    # only rollouts are recorded: the PPO updates and evaluations are left out
    assert 0 < profile["wall_s"] < json.loads((run_dir / "summary.json").read_text())["wall_s"]
    assert profile["bottleneck_reason"] in capsys.readouterr().out
