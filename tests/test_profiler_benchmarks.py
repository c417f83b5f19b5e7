"""Smoke tests: the profiler's benchmark scripts run end to end with tiny numbers (no
timing is asserted) and write the JSON the docs describe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def _run(script: str, *args: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=280,
    )


def test_gpu_stages_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu_stages.json"
    _run(
        "gpu_stages.py",
        "--device",
        "cpu",
        "--num-envs",
        "2",
        "--env-seconds",
        "0.002",
        "--decisions",
        "3",
        "--rounds",
        "1",
        "--stages",
        "1",
        "2",
        "--width",
        "32",
        "--tokens",
        "4",
        "--output",
        str(out),
    )
    result = json.loads(out.read_text())
    assert [r["config"] for r in result["rows"]] == ["serial", "stages=1", "stages=2", "decoupled"]
    for row in result["rows"]:
        assert row["round_ms"] > 0
        assert row["profile"]["bottleneck"] in ("env", "policy", "transport", "straggler")
    assert result["device"] == "cpu" and result["bound_speedup"] >= 1.0
    assert result["commit"] and result["machine"]["usable_cpus"]  # where and when it ran


def test_profiler_overhead_runs(tmp_path):
    out = tmp_path / "overhead.json"
    _run(
        "profiler_overhead.py",
        "--env-id",
        "Pendulum-v1",
        "--num-envs",
        "2",
        "--steps",
        "30",
        "--warmup",
        "5",
        "--rounds",
        "1",
        "--output",
        str(out),
    )
    result = json.loads(out.read_text())
    assert set(result["table"]) == {"off", "on"}
    assert result["runs"]["on"][0]["commands_recorded"] == 2 * 36  # reset + warm-up + timed
    assert result["record_costs"]["on_added_us"] > 0
