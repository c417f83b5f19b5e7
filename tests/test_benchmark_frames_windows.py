"""``benchmarks/frames_windows.py``: frames.py run in turn with two window lengths, tiny.

Checks the JSON's shape and that each run used its window; no timing is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script

pytest.importorskip("tyro")


@pytest.mark.timeout(240)
def test_frames_windows_tiny_run(tmp_path: Path) -> None:
    script = load_script("benchmarks/frames_windows.py", "benchmarks_frames_windows")
    output = tmp_path / "windows.json"
    script.main(
        [
            "--steps", "2", "3", "--rounds", "1", "--output", str(output), "--",
            "--envs", "2", "--sides", "16", "--cpu-cases", "--backends", "sync", "step",
            "--profile-case", "", "--rounds", "2", "--warmup", "1",
        ]
    )  # fmt: skip
    written = json.loads(output.read_text())
    assert list(written["windows"]) == ["2", "3"]
    assert [str(run["args"]["steps"]) for run in written["runs"]] == ["2", "3"]
    for (summary,) in written["windows"].values():
        assert summary["step_vs_sync"] > 0 and summary["round_ratio_spread"] >= 1
        assert summary["copy_false_vs_sync"] is None  # that backend was not run
    table = output.with_suffix(".md").read_text()
    assert table.startswith("| steps per window |") and "\n| 3 | " in table
