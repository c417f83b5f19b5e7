"""Smoke test of ``benchmarks/rollout_overlap.py --workload offcpu`` (the overlap
workload) with tiny numbers, and its ideal bound. No speed is asserted."""

from __future__ import annotations

from types import ModuleType

import pytest

from .conftest import load_script

pytest.importorskip("tyro")
pytest.importorskip("torch")


def _load_script() -> ModuleType:
    return load_script("benchmarks/rollout_overlap.py", "benchmarks_rollout_overlap")


def test_the_ideal_rate_is_the_cores_bound_on_env_steps_and_observation_work():
    bench = _load_script()
    # 4 envs, 4 ms CPU per step, 2 ms per observation, 2 cores
    assert bench.ideal_rate(4, 1, 0.004, 0.002, 2) == pytest.approx(4 / 0.024)  # k*Te + k*B
    assert bench.ideal_rate(4, 2, 0.004, 0.002, 2) == pytest.approx(4 / 0.012)
    assert bench.ideal_rate(4, 4, 0.004, 0.002, 2) == pytest.approx(4 / 0.008)  # N*B = cores


@pytest.mark.timeout(180)
def test_offcpu_workload_runs_every_lever_and_reports_the_ratio():
    bench = _load_script()
    args = bench.Args(
        workload="offcpu",
        step_ms=0.5,
        policy_ms_per_obs=0.2,
        stages=(1, 2),
        levers=("inherit", "nice5+pin+idle"),
        env_steps=8,
        repeats=1,
    )
    result = bench.run_offcpu(args)
    rows = {(r["lever"], r["stages"]): r for r in result["rows"]}
    assert set(rows) == {(lever, s) for lever in ("inherit", "nice5+pin+idle") for s in (1, 2)}
    for row in rows.values():
        assert row["steps_per_s"] > 0 and len(row["samples"]) == 1
        assert row["of_ideal"] == pytest.approx(row["steps_per_s"] / row["ideal_steps_per_s"])
    table = bench.offcpu_table(result)
    assert (
        "| ideal steps/s |" in table
        and "nice5+pin+idle" in table
        and "Waiting for a core" in table
        and "2 stages: best" in table
    )
    with pytest.raises(ValueError, match="unknown token"):
        bench._Lever.parse("nice5+fast")
