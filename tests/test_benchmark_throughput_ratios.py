"""The ratio and target code behind every ratio ``benchmarks/throughput.py`` publishes.

Known per-round rates go in through `summarise` and `targets` (no env is stepped), and the
ratios, the best config and met / not met come out as worked out by hand. Each input is
chosen so that the other method (a ratio of the medians, the best by median steps/s)
would give a different answer, so a change of method fails here.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import pytest

from .conftest import load_script

pytest.importorskip("tyro")

SYNC = "gymnasium SyncVectorEnv"
ASYNC = "gymnasium AsyncVectorEnv"


@pytest.fixture(scope="module")
def throughput() -> ModuleType:
    return load_script("benchmarks/throughput.py", "benchmarks_throughput")


def _backend(
    throughput: ModuleType,
    name: str,
    rates: list[float],
    *,
    group: str = "ours",
    config: dict[str, Any] | None = None,
    parent_cpu: float = 10.0,
    worker_cpu: float | None = 30.0,
) -> Any:
    backend = throughput.Backend(name, group, config or {}, build=None, prepare=None)
    backend.results = [
        {
            "steps_per_s": rate,
            "parent_cpu_us_per_env_step": parent_cpu,
            "worker_cpu_us_per_env_step": worker_cpu,
        }
        for rate in rates
    ]
    return backend


def _ours(throughput: ModuleType, name: str, rates: list[float], loop: str, epw: int, **kw):
    config = {"loop": loop, "num_stages": 1, "envs_per_worker": epw}
    return _backend(throughput, name, rates, config=config, **kw)


def _rows(throughput: ModuleType, *backends: Any) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in throughput.summarise(list(backends))}


def test_vs_sync_is_the_median_of_per_round_paired_ratios(throughput):
    sync = _backend(throughput, SYNC, [100.0, 200.0, 300.0], group="gymnasium")
    ours = _ours(throughput, "ours step 1x4", [150.0, 150.0, 330.0], "step", 4)
    rows = _rows(throughput, sync, ours)

    row = rows["ours step 1x4"]
    # rounds: 150/100 = 1.5, 150/200 = 0.75, 330/300 = 1.1 -> median 1.1
    # (the ratio of the medians would be 150 / 200 = 0.75)
    assert row["vs_sync"] == pytest.approx(1.1)
    assert row["steps_per_s"] == 150.0
    assert (row["steps_per_s_min"], row["steps_per_s_max"]) == (150.0, 330.0)
    assert rows[SYNC]["vs_sync"] == pytest.approx(1.0)
    assert row["vs_async"] is None  # no AsyncVectorEnv in this run
    assert row["total_cpu_us_per_env_step"] == pytest.approx(40.0)


def test_vs_async_pairs_each_round_with_asyncs_round(throughput):
    asyn = _backend(throughput, ASYNC, [50.0, 100.0, 200.0], group="gymnasium")
    ours = _ours(throughput, "ours step 1x4", [100.0, 300.0, 100.0], "step", 4)
    # rounds: 2.0, 3.0, 0.5 -> median 2.0 (the ratio of the medians would be 100 / 100)
    assert _rows(throughput, asyn, ours)["ours step 1x4"]["vs_async"] == pytest.approx(2.0)


def test_rounds_that_do_not_pair_are_refused(throughput):
    sync = _backend(throughput, SYNC, [100.0, 200.0], group="gymnasium")
    ours = _ours(throughput, "ours step 1x4", [150.0, 150.0, 330.0], "step", 4)
    with pytest.raises(ValueError):
        throughput.summarise([sync, ours])


def test_the_ceiling_is_the_usable_cores_times_the_single_env(throughput):
    sync = _backend(throughput, SYNC, [100.0, 100.0, 100.0], group="gymnasium")
    single = _backend(throughput, "single env, in-process", [40.0, 60.0, 50.0], group="reference")
    rows = throughput.summarise([sync, single])
    ceiling = rows[-1]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert ceiling["name"] == f"ceiling ({cores} cores x single env)"
    assert ceiling["steps_per_s"] == pytest.approx(50.0 * cores)
    assert ceiling["vs_sync"] == pytest.approx(0.5 * cores)


def _run(throughput: ModuleType) -> list[Any]:
    """A run where the best by median steps/s is not the best by paired ratio to Sync."""
    return [
        _backend(throughput, SYNC, [100.0, 400.0, 100.0], group="gymnasium"),
        _backend(throughput, ASYNC, [50.0, 200.0, 50.0], group="gymnasium"),
        _backend(
            throughput,
            "single env, in-process",
            [60.0, 60.0, 60.0],
            group="reference",
            parent_cpu=20.0,
            worker_cpu=None,
        ),  # fmt: skip
        # 1.6, 0.4, 1.6 -> vs Sync 1.6; median 160
        _ours(throughput, "ours step 1x4", [160.0, 160.0, 160.0], "step", 4, worker_cpu=20.0),
        # 1.0, 0.5, 3.0 -> vs Sync 1.0; median 200, the higher
        _ours(throughput, "ours step 2x4", [100.0, 200.0, 300.0], "step", 4, worker_cpu=28.0),
        # 1.5, 0.375, 1.5 -> vs Sync 1.5; median 150
        _ours(throughput, "ours staged 2x4", [150.0, 150.0, 150.0], "staged", 4),
        # 0.9, 1.0, 2.0 -> vs Sync 1.0; median 200, the higher
        _ours(throughput, "ours staged 2x2", [90.0, 400.0, 200.0], "staged", 2),
    ]


def test_targets_take_the_best_by_paired_ratio_and_pair_every_ratio(throughput):
    result = throughput.targets(throughput.summarise(_run(throughput)), [])

    assert result["best_ours"] == "ours step 1x4"  # not 2x4, the higher median
    assert result["vs_sync"] == {"target": 1.5, "measured": pytest.approx(1.6), "met": True}
    # 160/50, 160/200, 160/50 -> 3.2
    assert result["vs_async"]["measured"] == pytest.approx(3.2)
    assert result["vs_async"]["met"] is True
    assert result["staged_vs_step"]["staged"] == "ours staged 2x4"  # not 2x2
    # 150/160 in every round
    assert result["staged_vs_step"]["measured"] == pytest.approx(0.9375)
    assert result["staged_vs_step"]["met"] is False
    # 4 envs per worker: 10 + 20 - 20 = 10 (1x4) and 10 + 28 - 20 = 18 (2x4) -> 10, met
    assert result["overhead_us"]["per_config"] == {
        "ours step 1x4": pytest.approx(10.0),
        "ours step 2x4": pytest.approx(18.0),
    }
    assert result["overhead_us"]["measured"] == pytest.approx(10.0)
    assert result["overhead_us"]["met"] is True
    assert result["overhead_us"]["single_env_cpu_us"] == 20.0
    assert result["vs_envpool_async"]["met"] is None  # EnvPool not in this run
    assert "note" in result["vs_envpool_async"]


def test_the_envpool_ratio_is_paired_not_a_ratio_of_medians(throughput):
    backends = [
        _backend(throughput, SYNC, [100.0, 100.0, 100.0], group="gymnasium"),
        _backend(throughput, "EnvPool async (batch 4)", [100.0, 400.0, 400.0], group="envpool"),
        _ours(throughput, "ours step 1x4", [90.0, 100.0, 400.0], "step", 4),
    ]
    result = throughput.targets(throughput.summarise(backends), [])
    # paired: 0.9, 0.25, 1.0 -> 0.9, met; the ratio of the medians, 100 / 400, would not be
    assert result["vs_envpool_async"] == {
        "target": 0.8,
        "measured": pytest.approx(0.9),
        "met": True,
    }


def _default_run(throughput: ModuleType) -> list[Any]:
    return [
        _backend(throughput, SYNC, [100.0, 100.0, 200.0], group="gymnasium"),
        _backend(throughput, "EnvPool async (batch 4)", [100.0, 150.0, 400.0], group="envpool"),
        # 1.2, 1.2, 0.6 -> 1.2 over Sync (the ratio of the medians, 120 / 100, is the same)
        _ours(throughput, "ours step default", [120.0, 120.0, 120.0], "step", None),
        _ours(throughput, "ours step 1x4", [300.0, 300.0, 300.0], "step", 4),
        # over the default step: 1.0, 1.25, 1.0 -> 1.0; over EnvPool async: 1.2, 1.0, 0.3 -> 1.0
        _ours(throughput, "ours send/recv default (batch 4)", [120.0, 150.0, 120.0], "send_recv", None),
    ]  # fmt: skip


@pytest.mark.parametrize(("num_envs", "target", "met"), [(8, 1.1, True), (32, 1.5, False)])
def test_the_default_layout_over_sync_and_send_recv_over_its_step(
    throughput, num_envs, target, met
):
    result = throughput.targets(
        throughput.summarise(_default_run(throughput)), [], num_envs=num_envs
    )
    # the default row, not the best (1x4, 3.0x)
    assert result["default_vs_sync"] == {
        "target": target,
        "measured": pytest.approx(1.2),
        "met": met,
    }
    assert result["send_recv_vs_step"] == {
        "target": 1.0,
        "measured": pytest.approx(1.0),
        "met": True,
    }
    assert result["send_recv_vs_envpool_async"]["measured"] == pytest.approx(1.0)
    assert result["send_recv_vs_envpool_async"]["met"] is True


def test_default_targets_unmeasured_without_their_rows(throughput):
    backends = [_backend(throughput, SYNC, [100.0, 100.0, 100.0], group="gymnasium")]
    result = throughput.targets(throughput.summarise(backends), [])
    for key in ("default_vs_sync", "send_recv_vs_step", "send_recv_vs_envpool_async"):
        assert result[key]["measured"] is None and result[key]["met"] is None


def _timed(name: str, rates: list[float], **extra: Any) -> dict[str, Any]:
    return {"name": name, "rounds": [{"steps_per_s": r} for r in rates], **extra}


@pytest.mark.parametrize(("ours_us", "met"), [(30.0, True), (40.0, False)])
def test_null_step_over_the_pipe_echo(throughput, ours_us, met):
    null_rows = [
        {"backend": "ours", "workers": 1, "us_per_worker_round_trip": ours_us},
        {"backend": "ours", "workers": 8, "us_per_worker_round_trip": 5.0},
        {"backend": "bare Pipe echo", "workers": 1, "us_per_worker_round_trip": 50.0},
    ]
    result = throughput.targets([], null_rows)["null_vs_echo"]
    assert result == {"target": 0.7, "measured": pytest.approx(ours_us / 50.0), "met": met}


@pytest.mark.parametrize(
    ("fast", "measured", "met"),
    [([100.0, 130.0, 90.0], 1.0, True), ([95.0, 130.0, 90.0], 0.95, False)],
)
def test_slow_env_fast_path_over_the_pickled_path(throughput, fast, measured, met):
    slow_rows = [
        _timed("slow ours step 2x4", fast),
        _timed("slow ours step 2x4 pickled", [100.0, 100.0, 100.0]),
        _timed("slow gymnasium SyncVectorEnv", [50.0, 50.0, 50.0]),
    ]
    result = throughput.targets([], [], slow_rows)["slow_env"]
    assert result["target"] == throughput.SLOW_TOLERANCE == 0.97
    assert result["measured"] == pytest.approx(measured)
    assert result["met"] is met


def test_decoupled_over_the_sync_loop_with_the_ceilings_ratio(throughput):
    decoupled_rows = [
        _timed("decoupled workload: sync step loop", [100.0, 200.0, 100.0], ceiling_steps_per_s=250.0),
        _timed("decoupled workload: send/recv (batch 4)", [250.0, 300.0, 150.0], ceiling_steps_per_s=490.0),
    ]  # fmt: skip
    result = throughput.targets([], [], [], decoupled_rows)["decoupled"]
    # 2.5, 1.5, 1.5 -> 1.5
    assert result["measured"] == pytest.approx(1.5)
    assert result["met"] is False
    assert result["ceiling_ratio"] == pytest.approx(1.96)


def test_format_targets_says_met_not_met_and_not_measured(throughput):
    result = {
        "best_ours": "ours step 1x4",
        "vs_sync": {"target": 1.5, "measured": 1.6, "met": True},
        "overhead_us": {"target": 10.0, "measured": 38.5, "met": False},
        "vs_envpool_async": {"target": 0.8, "measured": None, "met": None},
    }
    lines = throughput.format_targets(result).splitlines()
    assert lines[2:] == [
        "| vs_sync | >= 1.5 | 1.60 | met |",
        "| overhead_us | <= 10 | 38.50 | NOT met |",
        "| vs_envpool_async | >= 0.8 |  | not measured |",
    ]


def test_the_parallel_ceiling_bounds_are_paired_ratios_and_printed(throughput):
    backends = [
        *_default_run(throughput),
        # over Sync: 1.1, 1.3, 0.55 -> 1.1; over EnvPool async: 1.1, 0.867, 0.275 -> 0.867
        _backend(
            throughput,
            "parallel ceiling (2 bare processes)",
            [110.0, 130.0, 110.0],
            group="reference",
        ),
    ]
    result = throughput.targets(throughput.summarise(backends), [], num_envs=32)
    assert result["parallel_ceiling"] == {
        "vs_sync": pytest.approx(1.1),
        "vs_envpool_async": pytest.approx(130.0 / 150.0),
    }
    assert result["default_vs_sync"]["met"] is False  # 1.2 < 1.5, and the host allows 1.1
    assert throughput.format_targets(result).splitlines()[-1] == (
        "Measured parallel ceiling (bare processes, no framework): 1.10x sync, 0.87x envpool_async"
    )
    without = throughput.targets(throughput.summarise(_default_run(throughput)), [])
    assert "parallel_ceiling" not in without
