"""Smoke test: ``benchmarks/default_layout.py --quick`` runs two of its workloads end to end
and writes the JSON its `format_table` renders. No speed is asserted: a quick run's numbers
mean nothing."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from .conftest import load_script

pytest.importorskip("tyro")


@pytest.mark.timeout(240)
def test_default_layout_benchmark_quick(tmp_path: Path) -> None:
    bench = load_script("benchmarks/default_layout.py", "benchmarks_default_layout")
    output = tmp_path / "default_layout.json"
    only = ("latency recv(4)/send", "heavy-offcpu 2 stages")
    bench.main(bench.Args(quick=True, only=only, output=output))

    saved = json.loads(output.read_text())
    assert [row["workload"] for row in saved["rows"]] == list(only)
    latency, heavy = saved["rows"]
    per_worker = bench.default_envs_per_worker(8, 1)
    default_name = f"default ({per_worker}/worker)"
    one = [] if per_worker == 1 else ["1/worker"]  # the default's own layout is not repeated
    assert [x["name"] for x in latency["layouts"]] == [default_name, *one]
    assert latency["reference_name"] == (one or [default_name])[0]
    assert heavy["reference"] == "best"
    for row in saved["rows"]:
        default, *explicit = row["layouts"]
        assert "envs_per_worker" not in default["kwargs"]
        num_envs = 8 if row is latency else 4
        defaults = bench.default_envs_per_worker(num_envs, default["kwargs"]["num_stages"])
        assert all(x["kwargs"]["envs_per_worker"] != defaults for x in explicit)
        assert all(len(x["samples"]) == saved["rounds"] == 1 for x in row["layouts"])
        ref = next(x for x in row["layouts"] if x["name"] == row["reference_name"])
        assert row["ratio"] == pytest.approx(default["samples"][0] / ref["samples"][0])
        assert row["met"] == (row["ratio"] >= row["target"])
        assert row["default_stepping"] and row["default_reasons"]
    best = max(heavy["layouts"], key=lambda x: statistics.median(x["samples"]))
    assert heavy["reference_name"] == best["name"]
    table = bench.format_table(saved)
    assert table == output.with_suffix(".md").read_text().rstrip("\n")
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(only)  # the header, then one per workload
    assert "latency recv(4)/send" in table and "interleaved rounds" in table
