"""Smoke test: ``benchmarks/throughput.py`` runs end to end with tiny numbers.

It checks that every backend is built, stepped and closed, and that the JSON has the
shape the docs describe. No timing is asserted: the numbers of a 2-env, few-step run
mean nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import load_script

pytest.importorskip("mujoco")
pytest.importorskip("stable_baselines3")
pytest.importorskip("tyro")


def _load_script() -> ModuleType:
    return load_script("benchmarks/throughput.py", "benchmarks_throughput")


def _envpool_importable() -> bool:
    try:
        import envpool  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.slow
def test_throughput_main_tiny(tmp_path: Path) -> None:
    throughput = _load_script()
    output = tmp_path / "throughput.json"
    argv = [
        "--num-envs", "2",
        "--steps", "3",
        "--warmup", "1",
        "--rounds", "1",
        "--null-steps", "3",
        "--configs", "1x1", "2x1",
        "--staged", "2x1",
        "--output", str(output),
    ]  # fmt: skip
    if not _envpool_importable():
        argv.append("--no-envpool")

    result = throughput.main(argv)

    saved = json.loads(output.read_text())
    assert saved["machine"]["python"] and saved["machine"]["usable_cores"] >= 1
    names = [row["name"] for row in saved["throughput"]]
    expected = [
        "single env, in-process",
        "gymnasium SyncVectorEnv",
        "gymnasium AsyncVectorEnv",
        "SB3 SubprocVecEnv",
        "ours step 1x1",
        "ours step 2x1",
        "ours staged 2x1",
        "ours send/recv default (batch 1)",
        f"parallel ceiling ({min(2, saved['machine']['usable_cores'])} bare processes)",
    ]
    if _envpool_importable():
        expected += ["EnvPool sync", "EnvPool async (batch 1)"]
    assert sorted(n for n in names if not n.startswith("ceiling")) == sorted(expected)
    for row in saved["throughput"]:
        assert row["steps_per_s"] > 0
        for r in row.get("rounds", []):
            assert r["env_steps"] == 3 * 2  # every backend does the same env steps
    null = {(row["backend"], row["workers"]) for row in saved["null_round_trip"]}
    assert ("ours", 1) in null and ("ours", 2) in null and ("bare Pipe echo", 1) in null
    assert set(saved["targets"]) >= {"best_ours", "vs_sync", "vs_async", "overhead_us"}
    assert result["targets"] == saved["targets"]


def test_parse_config_rejects_garbage() -> None:
    throughput = _load_script()
    assert throughput.parse_config("2x4") == (2, 4)
    assert throughput.parse_config("default") == (1, None)
    with pytest.raises(ValueError, match="STAGESxENVS_PER_WORKER"):
        throughput.parse_config("two")
