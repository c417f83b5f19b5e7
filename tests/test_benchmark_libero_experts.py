"""``benchmarks/libero_experts.py`` end to end on one init state of one task: the JSON's
per-task counts and the table's row; a task without an expert is listed, not run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script, needs_libero

pytestmark = needs_libero


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_expert_benchmark_counts_each_task(tmp_path: Path):
    bench = load_script("benchmarks/libero_experts.py", "benchmarks_libero_experts")
    output = tmp_path / "experts.json"
    args = bench.Args(suite="libero_goal", tasks=(8,), init_states="0", num_envs=1, output=output)
    report = bench.main(args)
    saved = json.loads(output.read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["no_expert"] == [] and list(saved["per_task"]) == ["8"] and saved["complete"]
    row = saved["per_task"]["8"]
    assert row["episodes"] == 1 and row["successes"] == len(row["succeeded"]) == 1
    assert row["failed"] == [] and row["env_steps"] > 0
    table = output.with_suffix(".md").read_text().splitlines()
    assert table[2].startswith("| libero_goal, 0-0 | ") and table[2].split(" | ")[9] == "1"


def test_the_expert_benchmark_lists_tasks_without_an_expert(tmp_path: Path):
    bench = load_script("benchmarks/libero_experts.py", "benchmarks_libero_experts")
    output = tmp_path / "none.json"
    report = bench.main(bench.Args(suite="libero_10", tasks=(0, 1), output=output))
    assert report["no_expert"] == [0, 1] and report["per_task"] == {}
    assert report["episodes"] == 0 and report["complete"]
    assert json.loads(output.read_text())["no_expert"] == [0, 1]
