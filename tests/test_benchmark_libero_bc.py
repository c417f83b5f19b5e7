"""``benchmarks/libero_bc.py`` end to end on a few init states: demos kept, BC metrics,
one held-out evaluation per init state in the JSON and the table; overlapping init
states are refused before any env starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script, needs_libero

pytestmark = needs_libero


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bc_benchmark_collects_clones_and_evaluates(tmp_path: Path):
    bench = load_script("benchmarks/libero_bc.py", "benchmarks_libero_bc")
    output = tmp_path / "bc.json"
    args = bench.Args(
        suite="libero_object",
        task_id=0,
        demo_init_states="0:3",
        eval_init_states="3",
        num_envs=1,
        max_epochs=3,
        output=output,
    )
    report = bench.main(args)
    saved = json.loads(output.read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["demos"]["episodes"] == 3 and 1 <= saved["demos"]["kept"] <= 3
    assert saved["demos"]["env_steps"] > 0 and saved["bc"]["epochs"] <= 3
    assert saved["bc"]["heldout_mse"] > 0 and saved["bc"]["heldout_mse_baseline"] > 0
    assert saved["eval"]["init_state_ids"] == [3] and len(saved["eval"]["successes"]) == 1
    assert saved["eval_success_rate"] in (0.0, 1.0)
    row = output.with_suffix(".md").read_text().splitlines()[2]
    assert row.startswith("| libero_object 0 | ") and row.endswith("/1** |")


def test_the_bc_benchmark_refuses_overlapping_init_states(tmp_path: Path):
    bench = load_script("benchmarks/libero_bc.py", "benchmarks_libero_bc")
    args = bench.Args(demo_init_states="0:5", eval_init_states="4:6", output=tmp_path / "x.json")
    with pytest.raises(ValueError, match="eval_init_states.*\\[4\\]"):
        bench.main(args)
    assert not (tmp_path / "x.json").exists()
