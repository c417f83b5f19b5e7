"""Smoke test: ``benchmarks/frames.py`` runs end to end with tiny numbers, and its targets
and table come from the rows as documented.

No timing is asserted: the figures of a 2-env, few-step run mean nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import load_script

pytest.importorskip("tyro")
pytest.importorskip("stable_baselines3")


@pytest.fixture(scope="module")
def frames() -> ModuleType:
    return load_script("benchmarks/frames.py", "benchmarks_frames")


@pytest.mark.slow
def test_frames_main_tiny(frames, tmp_path: Path) -> None:
    output = tmp_path / "frames.json"
    argv = [
        "--envs", "2",
        "--sides", "16",
        "--cpu-cases", "2x16x1",
        "--steps", "3",
        "--cpu-steps", "2",
        "--warmup", "1",
        "--rounds", "1",
        "--profile-case", "2x16",
        "--profile-steps", "3",
        "--output", str(output),
    ]  # fmt: skip

    frames.main(argv)

    saved = json.loads(output.read_text())
    assert [c["case"] for c in saved["cases"]] == ["2 envs, 16 px", "2 envs, 16 px, 1 ms CPU"]
    plain, busy = saved["cases"]
    names = [r["name"] for r in busy["rows"]]
    assert names == [
        "gymnasium SyncVectorEnv",
        "gymnasium AsyncVectorEnv",
        "SB3 SubprocVecEnv (pickled)",
        "ours step",
        "ours step, no ring (copies)",
        "ours step copy=False",
        "ours staged (2 stages)",
        "ours recv/send (n/2)",
        frames.LIMIT,
        frames.CEILING,
    ]
    assert frames.CEILING not in [r["name"] for r in plain["rows"]]  # no env cost: no ceiling
    assert plain["frame_bytes_per_env_step"] == 2 * 16 * 16 * 3
    for row in plain["rows"]:
        assert row["steps_per_s"] > 0
        assert row["frames_gb_per_s"] == pytest.approx(row["steps_per_s"] * 1536 / 1e9)
    limit = next(r for r in plain["rows"] if r["name"] == frames.LIMIT)
    assert limit["share_of_limit"] == pytest.approx(1.0)
    time_ = saved["where_time_goes"]
    assert {"ring", "copy", "no_copy"} <= set(time_)  # copy=True with and without the ring
    assert (
        time_["copy"]["caller_copies_per_step"] >= 1
        and time_["no_copy"]["caller_copies_per_step"] == 0
    )
    assert time_["writes"]["gymnasium_us"] > 0 and time_["writes"]["row_writer_us"] > 0
    assert time_["caller_copy"]["new_batch_us"] > 0 and time_["caller_copy"]["envs"] == 2
    assert saved["run"]["machine"]["cpu_count"] >= 1
    assert frames.format_table(saved) in output.with_suffix(".md").read_text()


def _case(num_envs: int, side: int, cpu_ms: float, rows: dict[str, dict]) -> dict:
    return {
        "case": f"{num_envs} envs",
        "num_envs": num_envs,
        "side": side,
        "cpu_ms": cpu_ms,
        "rows": [{"name": name, **values} for name, values in rows.items()],
    }


def test_targets_read_the_ratios_of_their_cases(frames) -> None:
    result = {
        "cases": [
            _case(8, 224, 0.0, {"ours step": {"vs_sync": 9.0}}),  # not the target's case
            _case(
                32,
                224,
                0.0,
                {"ours step": {"vs_sync": 1.6}, "ours step copy=False": {"vs_sync": 1.9}},
            ),
            _case(16, 224, 2.0, {"ours step": {"vs_ceiling": 0.95}}),
        ]
    }
    got = [(t["measured"], t["met"]) for t in frames.targets(result)]
    assert got == [(1.6, True), (1.9, False), (0.95, True)]
    table = frames.format_targets({"targets": frames.targets(result)})
    assert "| 1.90 | not met |" in table


def test_frames_cuda_runs_its_code_on_the_cpu(tmp_path: Path) -> None:
    """The CUDA script's backends with ``--device cpu``: what a GPU machine runs, less the
    page-locking (no figures asserted)."""
    pytest.importorskip("torch")
    script = load_script("benchmarks/frames_cuda.py", "benchmarks_frames_cuda")
    output = tmp_path / "frames_cuda.json"
    argv = ["--device", "cpu", "--envs", "2", "--side", "16", "--steps", "2", "--warmup", "1"]
    result = script.main([*argv, "--rounds", "1", "--output", str(output)])
    names = [r["name"] for r in result["cases"][0]["rows"]]
    assert names[0] == "plain" and names[-1] == "ours"
    assert json.loads(output.read_text())["cases"][0]["rows"][0]["vs_plain"] == 1.0
    assert script.format_table(result) in output.with_suffix(".md").read_text()


def test_a_quick_run_leaves_the_full_runs_results_alone(frames, tmp_path: Path) -> None:
    assert frames.Args(quick=True).output.name == "frames_quick.json"
    assert frames.Args().output.name == "frames.json"
    assert frames.Args(quick=True, output=tmp_path / "x.json").output == tmp_path / "x.json"
