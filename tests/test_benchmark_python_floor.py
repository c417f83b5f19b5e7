"""Smoke test: ``benchmarks/python_floor.py`` runs its four variants end to end with tiny
numbers (no timing is asserted: a few null steps mean nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script

pytest.importorskip("tyro")


@pytest.mark.timeout(180)
def test_python_floor_runs_every_variant(tmp_path: Path) -> None:
    script = load_script("benchmarks/python_floor.py", "benchmarks_python_floor")
    output = tmp_path / "floor.json"
    report = script.main(
        [
            "--env", "null", "--num-envs", "4", "--envs-per-worker", "2",
            "--steps", "20", "--warmup", "5", "--rounds", "1", "--output", str(output),
        ]
    )  # fmt: skip
    written = json.loads(output.read_text())
    assert set(written["summary"]) == {"floor step", "floor sendrecv", "ours step", "ours sendrecv"}
    for row in report["summary"].values():
        assert row["env_steps_per_s"] > 0 and row["workers_cpu_us"] > 0
    assert report["summary"]["floor step"]["envs_per_call"] == 4
    assert 2 <= report["summary"]["floor sendrecv"]["envs_per_call"] <= 4
    assert "| floor | step |" in output.with_suffix(".md").read_text()


def test_python_floor_stand_in_work_rows(tmp_path: Path) -> None:
    script = load_script("benchmarks/python_floor.py", "benchmarks_python_floor")
    report = script.main(
        [
            "--env", "null", "--num-envs", "4", "--envs-per-worker", "2", "--steps", "20",
            "--warmup", "5", "--rounds", "1", "--no-ours", "--work-us", "200:0:0",
            "--output", str(tmp_path / "floor.json"),
        ]
    )  # fmt: skip
    rows = report["summary"]
    assert set(rows) == {
        "floor step",
        "floor sendrecv",
        "floor+200:0:0 step",
        "floor+200:0:0 sendrecv",
    }
    # 200 us of the caller's busy work per call: slower than the bare floor's same loop
    for loop in ("step", "sendrecv"):
        assert (
            rows[f"floor+200:0:0 {loop}"]["caller_cpu_us"] > rows[f"floor {loop}"]["caller_cpu_us"]
        )
    with pytest.raises(ValueError, match="work_us"):
        script.main(["--work-us", "1:2"])


def test_python_floor_refuses_a_layout_of_one_worker() -> None:
    script = load_script("benchmarks/python_floor.py", "benchmarks_python_floor")
    with pytest.raises(ValueError, match="num_envs"):
        script.main(["--num-envs", "4", "--envs-per-worker", "4"])
