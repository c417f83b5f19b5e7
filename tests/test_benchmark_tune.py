"""Smoke test: ``benchmarks/tune.py --quick`` runs end to end and writes the JSON and table
the docs describe. No speed is asserted: a quick run's numbers mean nothing."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import load_script

pytest.importorskip("tyro")


def _load_script() -> ModuleType:
    return load_script("benchmarks/tune.py", "benchmarks_tune")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tune_benchmark_quick(tmp_path: Path) -> None:
    bench = _load_script()
    output = tmp_path / "tune.json"
    report = bench.main(["--quick", "--workloads", "busy", "lognormal", "--output", str(output)])

    saved = json.loads(output.read_text())
    assert saved["machine"]["usable_cores"] >= 1 and saved["machine"]["load_avg_start"]
    assert [w["workload"] for w in saved["workloads"]] == ["busy", "lognormal"]
    for w in saved["workloads"]:
        names = [row["name"] for row in w["grid"]]
        assert names == [
            "staged 1x1", "staged 1x8", "staged 2x1", "staged 2x4", "staged 4x1", "staged 4x2",
            "decoupled b=1", "decoupled b=2", "decoupled b=4", "decoupled b=8",
        ]  # fmt: skip
        assert all(row["steps_per_s"] > 0 for row in w["grid"])
        assert w["tune"]["seconds"] > 0 and w["grid_seconds"] > 0
        # one pass: every point's stepping, one start-up each (the same as run in 1 round)
        assert 0 < w["grid_one_pass_seconds"] <= w["grid_seconds"] + 1e-9
        assert set(w["targets"]) == {
            "tuned_vs_best", "tuned_vs_best_met", "tune_vs_grid_time", "tune_vs_grid_time_met",
            "tune_vs_grid_time_as_run",
        }  # fmt: skip
        t = w["targets"]
        assert t["tune_vs_grid_time"] >= t["tune_vs_grid_time_as_run"] - 1e-9  # judged on one pass
    assert report["workloads"][0]["targets"] == saved["workloads"][0]["targets"]
    assert "Tuned / best" in output.with_suffix(".md").read_text()
