"""`tune()` against a grid of measured layouts, on three workloads, 8 envs each.

Workloads:

- ``halfcheetah``: gymnasium's HalfCheetah-v5 (light physics, tens of microseconds a step)
  with a tiny numpy MLP policy (17 -> 32 -> 6).
- ``busy``: a CPU-bound env of 4 ms a step (`BusyEnv`) with an off-CPU policy that sleeps
  2 ms per observation, as a GPU would (the overlap workload).
- ``lognormal``: an env whose step sleeps a lognormal time (`LatencyEnv`, median 5 ms,
  p99 ~10x the median) with an off-CPU policy of 3 ms + 0.5 ms per observation.

The grid: staged ``num_stages`` in {1, 2, 4} x ``envs_per_worker`` in {1, 8 / num_stages},
and decoupled ``recv`` batch sizes {1, 2, 4, 8}; each point builds its vector env and runs
`pipelined_vec_env.tuning.tuner.measure_layout` (the loop `tune` models) for the same number of env
steps (``point_seconds`` times the rate `tune` measured, so one number for every point of a
workload). `tune` runs first, with its own time; its chosen layout's rate is the grid's
measurement of the same layout (or a run of the same length if the grid lacks it).

Targets: the tuned layout reaches >= 0.9 of the grid's best, and `tune` takes <= 1/5 of the
grid's wall time (vector env start-ups included on both sides). The grid's time is that of
one pass: each point stepped for all its rounds' env steps, with one start-up and close
(the median of its rounds'); the rounds themselves start every point once per round, which
the time as run (``grid_seconds``, also reported) counts each time.

Run::

    python benchmarks/tune.py                  # default, about 3 minutes
    python benchmarks/tune.py --quick          # seconds; a smoke run, targets meaningless
    python benchmarks/tune.py --workloads busy lognormal --point-seconds 3

Results go to ``benchmarks/results/tune.json`` (and ``tune.md``, the table) with the
machine's description and load.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cloudpickle
import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, machine_identity, package_versions, relative_paths  # noqa: E402

from pipelined_vec_env import PipelinedVectorEnv, tune  # noqa: E402
from pipelined_vec_env.debug_envs import BusyEnv, LatencyEnv  # noqa: E402
from pipelined_vec_env.tuning.tuner import measure_layout  # noqa: E402

__all__ = ["Args", "main"]

# loaded by path (tests): workers cannot import this module by name
if __name__ != "__main__":
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

RESULTS = Path(__file__).resolve().parent / "results"
Workload = Literal["halfcheetah", "busy", "lognormal"]


@dataclass
class Args:
    """tune() vs a measured grid of layouts."""

    workloads: tuple[Workload, ...] = ("halfcheetah", "busy", "lognormal")
    """Workloads to run."""
    num_envs: int = 8
    """Envs per vector env."""
    point_seconds: float = 1.5
    """Length of each grid point, as env steps: this many seconds at tune's measured rate."""
    rounds: int = 3
    """Rounds over the grid (every other one in reverse order, each rotated by one more
    point); each point's rate is the median over rounds, so drift on a shared machine
    spreads over all points."""
    max_seconds: float = 60.0
    """tune()'s max_seconds."""
    quick: bool = False
    """Tiny numbers for a smoke test (targets are not meaningful)."""
    output: Path = RESULTS / "tune.json"
    """JSON output path (a Markdown table goes beside it)."""


def _mlp_policy(obs_dim: int, action_dim: int) -> Any:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((obs_dim, 32)).astype(np.float32) / np.sqrt(obs_dim)
    w2 = rng.standard_normal((32, action_dim)).astype(np.float32) / np.sqrt(32)

    def policy(obs: np.ndarray) -> np.ndarray:
        return np.tanh(np.tanh(np.asarray(obs, dtype=np.float32) @ w1) @ w2)

    return policy


def _sleep_policy(fixed_s: float, per_obs_s: float, action_dim: int) -> Any:
    def policy(obs: np.ndarray) -> np.ndarray:
        time.sleep(fixed_s + per_obs_s * len(obs))
        return np.zeros((len(obs), action_dim), dtype=np.float32)

    return policy


def _make_halfcheetah() -> Any:
    import gymnasium as gym

    return gym.make("HalfCheetah-v5")


def workload(name: str, num_envs: int) -> tuple[list, Any, str]:
    """Env fns, policy and a description of one workload."""
    if name == "halfcheetah":
        return (
            [_make_halfcheetah] * num_envs,
            _mlp_policy(17, 6),
            "HalfCheetah-v5, numpy MLP 17-32-6 policy",
        )
    if name == "busy":
        fn = functools.partial(BusyEnv, step_seconds=0.004, obs_dim=16, action_dim=6)
        return (
            [fn] * num_envs,
            _sleep_policy(0.0, 0.002, 6),
            "BusyEnv 4 ms CPU, policy sleeps 2 ms/obs",
        )
    if name == "lognormal":
        fns = [
            functools.partial(LatencyEnv, median_seconds=0.005, sigma=0.99, latency_seed=i)
            for i in range(num_envs)
        ]
        return (
            fns,
            _sleep_policy(0.003, 0.0005, 2),
            "LatencyEnv median 5 ms p99 ~10x, policy sleeps 3 + 0.5 ms/obs",
        )
    raise ValueError(f"workload: expected halfcheetah, busy or lognormal, got {name!r}")


def grid(num_envs: int) -> list[dict[str, Any]]:
    """The grid's layouts: staged stages x envs per worker, then decoupled batch sizes."""
    points = []
    for stages in (1, 2, 4):
        for per_worker in sorted({1, num_envs // stages}):
            points.append(
                {
                    "mode": "staged",
                    "num_stages": stages,
                    "envs_per_worker": per_worker,
                    "batch_size": None,
                }
            )
    for batch in (1, 2, 4, 8):
        if batch <= num_envs:
            points.append(
                {"mode": "decoupled", "num_stages": 1, "envs_per_worker": 1, "batch_size": batch}
            )
    return points


def _name(point: dict[str, Any]) -> str:
    if point["mode"] == "staged":
        name = f"staged {point['num_stages']}x{point['envs_per_worker']}"
    else:
        name = f"decoupled b={point['batch_size']}"
    nice = point.get("worker_nice")
    return name if nice is None else f"{name} nice {nice}"


def _run_point(fns: list, policy: Any, point: dict[str, Any], env_steps: int) -> dict[str, Any]:
    start = time.perf_counter()
    envs = PipelinedVectorEnv(
        fns,
        num_stages=point["num_stages"],
        envs_per_worker=point["envs_per_worker"],
        worker_nice=point.get("worker_nice"),
    )
    try:
        stats = measure_layout(envs, policy, batch_size=point["batch_size"], env_steps=env_steps)
    finally:
        envs.close()
    return {**point, "name": _name(point), **stats, "wall_s": time.perf_counter() - start}


def run_workload(name: str, args: Args) -> dict[str, Any]:
    """Tune, then measure the grid, for one workload."""
    fns, policy, description = workload(name, args.num_envs)
    tune_kwargs: dict[str, Any] = {"max_seconds": args.max_seconds}
    if args.quick:
        tune_kwargs.update(max_seconds=10.0, probe_seconds=0.2, verify_seconds=0.1, verify_top=1)
    result = tune(fns, policy, **tune_kwargs)
    rate = result.measured_steps_per_s or result.predicted_steps_per_s
    env_steps = max(
        args.num_envs * 4, int(rate * args.point_seconds) // args.num_envs * args.num_envs
    )
    print(f"\n== {name}: {description}; tune {result.seconds:.1f} s -> {_name_of(result)}")
    print(result.format_table())

    chosen = {
        "mode": result.mode,
        "num_stages": result.kwargs["num_stages"],
        "envs_per_worker": result.kwargs["envs_per_worker"],
        "batch_size": result.batch_size,
        "worker_nice": result.kwargs.get("worker_nice"),
    }
    points = grid(args.num_envs)
    in_grid = _name(chosen) in {_name(p) for p in points}
    # the tuned layout, if the grid lacks it, runs among the grid's points in every round
    # (measured like them, not counted in the grid's time)
    order = points if in_grid else [*points, chosen]
    runs: dict[str, list[dict[str, Any]]] = {}
    grid_s = 0.0
    for r in range(args.rounds):
        rotated = order[r // 2 % len(order) :] + order[: r // 2 % len(order)]
        for point in rotated if r % 2 == 0 else rotated[::-1]:
            run = _run_point(fns, policy, point, env_steps)
            if point is not chosen or in_grid:
                grid_s += run["wall_s"]
            runs.setdefault(run["name"], []).append(run)
    # The rounds are how the grid is measured (drift spread over every point), not part of
    # a grid search: one pass steps each point for all its rounds' env steps but starts
    # and closes its vector env once. The time target is judged on that (shorter) time.
    one_pass_s = 0.0
    for point in points:
        point_runs = runs[_name(point)]
        one_pass_s += sum(x["seconds"] for x in point_runs)
        one_pass_s += float(np.median([x["wall_s"] - x["seconds"] for x in point_runs]))
    rows = []
    for point in points:
        label = _name(point)
        rates = [x["steps_per_s"] for x in runs[label]]
        rows.append(
            {**point, "name": label, "steps_per_s": float(np.median(rates)), "rounds": rates}
        )
    tuned_rates = [x["steps_per_s"] for x in runs[_name(chosen)]]
    tuned = {"name": _name(chosen), "steps_per_s": float(np.median(tuned_rates))}
    best = max(rows, key=lambda r: r["steps_per_s"])
    ratio = tuned["steps_per_s"] / best["steps_per_s"]
    time_ratio = result.seconds / one_pass_s
    predicted = {row["name"]: row["predicted"] for row in result.table}
    for r in rows:
        r["predicted"] = predicted.get(r["name"])
    return {
        "workload": name,
        "description": description,
        "env_steps_per_point": env_steps,
        "tune": {
            "seconds": result.seconds,
            "mode": result.mode,
            "kwargs": result.kwargs,
            "batch_size": result.batch_size,
            "name": _name_of(result),
            "predicted_steps_per_s": result.predicted_steps_per_s,
            "verified_steps_per_s": result.measured_steps_per_s,
            "measurements": result.measurements,
            "table": result.table,
            "arguments": tune_kwargs,
        },
        "grid": rows,
        "grid_seconds": grid_s,
        "grid_one_pass_seconds": one_pass_s,
        "tuned": {**tuned, "in_grid": in_grid, "rounds": tuned_rates},
        "best": {"name": best["name"], "steps_per_s": best["steps_per_s"]},
        "targets": {
            "tuned_vs_best": ratio,
            "tuned_vs_best_met": ratio >= 0.9,
            "tune_vs_grid_time": time_ratio,
            "tune_vs_grid_time_met": time_ratio <= 0.2,
            "tune_vs_grid_time_as_run": result.seconds / grid_s,
        },
    }


def _name_of(result: Any) -> str:
    return _name({**result.kwargs, "mode": result.mode, "batch_size": result.batch_size})


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Machine: {report['machine']['cpu']}, {report['machine']['usable_cores']} usable cores, "
        f"load average {report['machine']['load_avg_start']} at start "
        f"(shared with other jobs: absolute numbers vary, ratios within a run hold).",
        "",
    ]
    for w in report["workloads"]:
        t = w["targets"]
        lines += [
            f"**{w['workload']}** ({w['description']}), {w['env_steps_per_point']} env steps per "
            f"point, median of {len(w['grid'][0]['rounds'])} rounds",
            "",
            "| layout | predicted steps/s | measured steps/s | vs best |",
            "|---|---:|---:|---:|",
        ]
        best = w["best"]["steps_per_s"]
        for r in w["grid"]:
            mark = " (tuned)" if r["name"] == w["tuned"]["name"] else ""
            pred = "-" if r["predicted"] is None else f"{r['predicted']:.0f}"
            lines.append(
                f"| {r['name']}{mark} | {pred} | {r['steps_per_s']:.0f} | {r['steps_per_s'] / best:.2f} |"
            )
        lines += [
            "",
            f"tune: {w['tune']['seconds']:.1f} s, chose {w['tune']['name']}"
            + (
                ""
                if w["tuned"]["in_grid"]
                else f" (not in the grid; measured beside it: {w['tuned']['steps_per_s']:.0f} steps/s)"
            )
            + f"; grid: {w['grid_one_pass_seconds']:.1f} s as one pass "
            f"({w['grid_seconds']:.1f} s as run, in {len(w['grid'][0]['rounds'])} rounds). "
            f"Tuned / best = {t['tuned_vs_best']:.2f} (target >= 0.9: "
            f"{'met' if t['tuned_vs_best_met'] else 'NOT met'}); tune / grid time = "
            f"{t['tune_vs_grid_time']:.2f} (target <= 0.2: {'met' if t['tune_vs_grid_time_met'] else 'NOT met'}).",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; write JSON and Markdown; return the report."""
    args = tyro.cli(Args, args=argv)
    if args.quick:
        args.point_seconds = min(args.point_seconds, 0.1)
        args.rounds = 1
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    workloads = []
    for name in args.workloads:
        if name == "halfcheetah":
            try:
                import mujoco  # noqa: F401
            except ImportError:
                print("skipping halfcheetah: mujoco is not installed")
                continue
        workloads.append(run_workload(name, args))
    report = {
        "machine": {
            **machine_identity(),
            "cpu": cpu_model(),
            "usable_cores": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_start": load_start,
            "load_avg_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "packages": package_versions(["gymnasium", "mujoco", "numpy"]),
        },
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "workloads": workloads,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(relative_paths(report), indent=2, default=str) + "\n")
    markdown = _markdown(report)
    args.output.with_suffix(".md").write_text(markdown + "\n")
    print("\n" + markdown)
    return report


if __name__ == "__main__":
    main()
