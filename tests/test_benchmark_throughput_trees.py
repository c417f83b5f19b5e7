"""``benchmarks/throughput_trees.py``: its paired ratios, and one tiny run end to end.

The ratios are checked on made-up results (each later tree's row a known multiple of the
earlier's); the run checks that both trees' packages are the ones imported and that the
JSON has the comparison's shape. No timing is asserted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import load_script

pytest.importorskip("tyro")

REPO = Path(__file__).resolve().parents[1]


def _load_script() -> ModuleType:
    return load_script("benchmarks/throughput_trees.py", "benchmarks_throughput_trees")


def _result(sync: float, ours: float, ours_cpu: float, null_wall: float) -> dict:
    return {
        "throughput": [
            {"name": "gymnasium SyncVectorEnv", "steps_per_s": sync, "vs_sync": 1.0,
             "total_cpu_us_per_env_step": 50.0},
            {"name": "ours step 1x2", "steps_per_s": ours, "vs_sync": ours / sync,
             "total_cpu_us_per_env_step": ours_cpu},
            {"name": "ceiling", "steps_per_s": 2 * sync, "vs_sync": 2.0},
        ],
        "null_round_trip": [
            {"backend": "ours", "workers": 1, "us_per_worker_round_trip": null_wall,
             "parent_cpu_us": 10.0, "worker_cpu_us": null_wall - 10.0},
        ],
    }  # fmt: skip


def test_compare_takes_medians_of_paired_ratios() -> None:
    script = _load_script()
    # three rounds; the host runs the later tree's first round at half speed (Sync too)
    runs = [
        (_result(100, 150, 80, 30), _result(50, 90, 80, 60)),
        (_result(100, 150, 80, 30), _result(100, 165, 72, 33)),
        (_result(120, 180, 80, 30), _result(120, 198, 72, 33)),
    ]
    table = script.compare(runs)
    rows = {r["name"]: r for r in table["throughput"]}
    ours = rows["ours step 1x2"]
    assert ours["steps_later_over_earlier"] == pytest.approx(1.1)
    assert ours["vs_sync_later_over_earlier"] == pytest.approx(1.1)
    assert ours["cpu_later_over_earlier"] == pytest.approx(0.9)
    assert ours["steps_per_s"] == [150, 165]
    assert rows["gymnasium SyncVectorEnv"]["vs_sync_later_over_earlier"] == 1.0
    assert rows["ceiling"]["cpu_us"] == [None, None]
    assert rows["ceiling"]["cpu_later_over_earlier"] is None
    (null,) = table["null_round_trip"]
    assert null["wall_later_over_earlier"] == pytest.approx(1.1)
    assert null["wall_us"] == [30, 33]
    text = script.markdown(table, ["before", "after"])
    assert "| ours step 1x2 | 150 | 165 | 1.100 |" in text
    assert "| ours | 1 | 30.0 | 33.0 | 1.100 |" in text


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_throughput_trees_tiny_run(tmp_path: Path) -> None:
    pytest.importorskip("mujoco")
    pytest.importorskip("stable_baselines3")
    script = _load_script()
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "pipelined_vec_env", tree / "pipelined_vec_env")
    output = tmp_path / "trees.json"
    report = script.main(
        [
            "--trees", str(tree), str(REPO),
            "--rounds", "1",
            "--output", str(output),
            "--",
            "--only", "throughput", "null",
            "--num-envs", "2", "--steps", "3", "--warmup", "1", "--rounds", "1",
            "--null-steps", "3", "--configs", "1x1", "--staged", "--send-recv",
            "--no-envpool",
        ]
    )  # fmt: skip
    written = json.loads(output.read_text())
    assert report["packages"] == [
        "tree/pipelined_vec_env/__init__.py",
        f"{REPO.name}/pipelined_vec_env/__init__.py",
    ]
    assert written["packages"] == report["packages"]
    names = [r["name"] for r in written["comparison"]["throughput"]]
    assert "ours step 1x1" in names and "gymnasium SyncVectorEnv" in names
    assert {r["backend"] for r in written["comparison"]["null_round_trip"]} >= {"ours"}
    assert len(written["runs"]) == 1 and len(written["runs"][0]) == 2
    assert "| row |" in output.with_suffix(".md").read_text()
