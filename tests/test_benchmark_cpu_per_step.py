"""Smoke test: ``benchmarks/cpu_per_step.py`` runs end to end with tiny numbers.

Drives its `main` both ways (in this process, and with a core tree in a subprocess) and
checks the JSON's shape; no timing is asserted (a few steps mean nothing).
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
    return load_script("benchmarks/cpu_per_step.py", "benchmarks_cpu_per_step")


@pytest.mark.timeout(180)
def test_cpu_per_step_in_process_and_tree(tmp_path: Path, monkeypatch) -> None:
    script = _load_script()
    output = tmp_path / "cpu.json"
    tree = tmp_path / "tree"  # a copy of the package, run from the repository's root:
    shutil.copytree(REPO / "pipelined_vec_env", tree / "pipelined_vec_env")
    monkeypatch.chdir(REPO)  # the tree's package is measured, not the one in the cwd
    result = script.main(
        [
            "--cases", "null-1x2-step", "null-2x1-staged",
            "--trees", str(tree),
            "--rounds", "1", "--steps", "20", "--warmup", "2", "--num-envs", "2",
            "--output", str(output),
        ]
    )  # fmt: skip
    written = json.loads(output.read_text())
    assert set(written["cases"]) == {"null-1x2-step", "null-2x1-staged"}
    for by_tree in result["cases"].values():
        (figures,) = by_tree.values()
        assert figures["parent_us"] > 0 and figures["workers_us"] > 0
        assert len(figures["runs"]) == 1
        assert figures["package"] == str((tree / "pipelined_vec_env").resolve())
    in_process = script.measure("null-1x2-step", steps=10, warmup=2, num_envs=2)
    assert set(in_process) == {
        "parent_us", "workers_us", "wall_us", "envs_per_call", "load", "package"
    }  # fmt: skip
    assert in_process["envs_per_call"] == 2
    send_recv = script.measure("null-1x1-sendrecv", steps=10, warmup=2, num_envs=2)
    assert send_recv["parent_us"] > 0 and send_recv["workers_us"] > 0
    assert 1 <= send_recv["envs_per_call"] <= 2  # recv(batch_size=1) of 2 envs


def test_cpu_per_step_rejects_bad_case() -> None:
    script = _load_script()
    with pytest.raises(ValueError, match="case"):
        script.main(["--cases", "null-1x4-walk"])


@pytest.mark.timeout(180)
def test_cpu_per_step_summary_names_the_callers_waits(tmp_path: Path) -> None:
    script = _load_script()
    output = tmp_path / "cpu.json"
    result = script.main(
        [
            "--cases", "null-1x1-sendrecv", "null-1x2-step",
            "--summary", "--rounds", "1", "--steps", "40", "--warmup", "2",
            "--num-envs", "2", "--output", str(output),
        ]
    )  # fmt: skip
    written = json.loads(output.read_text())
    assert written["profiles"] == result["profiles"]
    recv = result["profiles"]["null-1x1-sendrecv"]
    assert "recv" in recv["caller_waits"]  # the lane's recv records its wait too
    step = result["profiles"]["null-1x2-step"]
    assert "recv" not in step["caller_waits"] and step["caller_waits"]
    for shares in result["profiles"].values():
        assert 0 <= shares["caller_busy"] <= 1
        assert 0 < shares["workers_stepping"] <= 1
        assert 0 <= sum(shares["caller_waits"].values()) <= 1 + 1e-6
        assert shares["step_p50_us"] > 0 and shares["bottleneck_reason"]
