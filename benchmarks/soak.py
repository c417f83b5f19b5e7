"""Soak test: a long staged run whose memory and file descriptors must stay flat.

Steps tiny envs (`CountingEnv`, short episodes, so
autoresets and info merging happen all the time) through a `PipelinedVectorEnv`
with several stages, the way a pipelined trainer does (``step_async`` on every stage,
then ``step_wait`` per stage), with a stage reset and a ``call`` now and then. Through
the run it samples:

- resident memory (psutil RSS) of the parent and of every descendant (workers, the
  forkserver, the resource tracker),
- open file descriptors of the parent and of the descendants,
- ``/dev/shm`` mappings of the parent.

After a warm-up (allocator pools and caches filling up), it fits a least-squares line to
each series against env steps and reports the slope in bytes (or fds) per 1e5 env steps,
and the drift that slope predicts over the whole measured span. A series is **flat**
when that drift is below ``--flat-bytes`` (memory) or exactly zero (fds, mappings).

Run::

    python benchmarks/soak.py                       # 1e6 env steps (minutes on 2 cores)
    python benchmarks/soak.py --steps 20000         # a quick check

Results go to ``benchmarks/results/soak.json`` (every sample, the fits, the machine).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tyro

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.debug_envs import CountingEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import cpu_model, machine_identity, package_versions, relative_paths  # noqa: E402

__all__ = ["Args", "fit_slope", "main", "sample"]


@dataclass
class Args:
    steps: int = 1_000_000
    """Env steps in all (a vector step of ``n`` envs counts ``n``)."""
    num_envs: int = 8
    """Envs in the vector env."""
    num_stages: int = 2
    """Pipeline stages."""
    envs_per_worker: int = 2
    """Envs per worker process."""
    kind: str = "dict"
    """CountingEnv observation space: "box" or "dict" (nested Dict/Tuple, shared memory)."""
    episode_length: int = 50
    """Steps per episode (autoresets every that many steps)."""
    samples: int = 100
    """Samples taken evenly through the run (plus one at the start)."""
    warmup_fraction: float = 0.1
    """Leading fraction of the run left out of the fits."""
    flat_bytes: int = 4 * 2**20
    """Memory counts as flat when the fitted drift over the measured span is below this."""
    output: Path = Path(__file__).parent / "results" / "soak.json"
    """Where the JSON goes."""


def _shm_maps() -> int:
    try:
        with open("/proc/self/maps") as maps:
            return sum("/dev/shm/" in line for line in maps)
    except OSError:  # not Linux
        return 0


def sample(steps: int, start: float) -> dict[str, Any]:
    """Memory and descriptors of this process and its descendants right now."""
    me = psutil.Process()
    children_rss = children_fds = 0
    children = 0
    for child in me.children(recursive=True):
        try:
            children_rss += child.memory_info().rss
            children_fds += child.num_fds()
            children += 1
        except psutil.NoSuchProcess:
            pass
    parent_rss = me.memory_info().rss
    return {
        "env_steps": steps,
        "seconds": time.perf_counter() - start,
        "parent_rss": parent_rss,
        "children_rss": children_rss,
        "total_rss": parent_rss + children_rss,
        "parent_fds": me.num_fds(),
        "children_fds": children_fds,
        "children": children,
        "shm_maps": _shm_maps(),
    }


def fit_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of ``y`` against ``x`` (0 for fewer than two points)."""
    if len(x) < 2 or np.ptp(x) == 0:
        return 0.0
    slope, _ = np.polyfit(x.astype(np.float64), y.astype(np.float64), 1)
    return float(slope)


def analyse(samples: list[dict[str, Any]], warmup_steps: int, flat_bytes: int) -> dict[str, Any]:
    """Fit each series after the warm-up; report slopes per 1e5 steps, drift and flatness."""
    measured = [s for s in samples if s["env_steps"] >= warmup_steps] or samples
    x = np.array([s["env_steps"] for s in measured])
    span = float(x.max() - x.min()) if len(x) else 0.0
    fits: dict[str, Any] = {}
    for key in (
        "parent_rss",
        "children_rss",
        "total_rss",
        "parent_fds",
        "children_fds",
        "shm_maps",
        "children",
    ):
        y = np.array([s[key] for s in measured])
        slope = fit_slope(x, y)
        drift = slope * span
        if key.endswith("rss"):
            flat = abs(drift) < flat_bytes
        else:  # counts must not move at all
            flat = bool(np.ptp(y) == 0)
        fits[key] = {
            "per_1e5_steps": slope * 1e5,
            "drift_over_span": drift,
            "first": int(y[0]),
            "last": int(y[-1]),
            "min": int(y.min()),
            "max": int(y.max()),
            "flat": bool(flat),
        }
    return {"measured_from_step": int(x.min()), "measured_span_steps": span, "fits": fits}


def machine_info() -> dict[str, Any]:
    """CPU, platform and package versions."""
    versions = package_versions(("gymnasium", "numpy", "cloudpickle", "psutil"))
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }


def _mib(value: float) -> str:
    return f"{value / 2**20:.2f}"


def format_table(samples: list[dict[str, Any]], analysis: dict[str, Any], rows: int = 11) -> str:
    """Markdown tables: a subset of the samples, then the fits."""
    picks = sorted({round(i * (len(samples) - 1) / (rows - 1)) for i in range(rows)})
    lines = [
        "| env steps | seconds | parent RSS MiB | workers RSS MiB | total RSS MiB | parent fds | workers fds | /dev/shm maps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i in picks:
        s = samples[i]
        lines.append(
            f"| {s['env_steps']:,} | {s['seconds']:.0f} | {_mib(s['parent_rss'])} | "
            f"{_mib(s['children_rss'])} | {_mib(s['total_rss'])} | {s['parent_fds']} | "
            f"{s['children_fds']} | {s['shm_maps']} |"
        )
    lines += [
        "",
        f"Fits from env step {analysis['measured_from_step']:,} on "
        f"({analysis['measured_span_steps']:,.0f} steps):",
        "",
        "| series | slope per 1e5 steps | drift over the span | min | max | flat |",
        "|---|---|---|---|---|---|",
    ]
    for key, fit in analysis["fits"].items():
        if key.endswith("rss"):
            slope = f"{fit['per_1e5_steps'] / 1024:+.1f} KiB"
            drift = f"{fit['drift_over_span'] / 1024:+.1f} KiB"
            low, high = _mib(fit["min"]) + " MiB", _mib(fit["max"]) + " MiB"
        else:
            slope = f"{fit['per_1e5_steps']:+.3f}"
            drift = f"{fit['drift_over_span']:+.3f}"
            low, high = str(fit["min"]), str(fit["max"])
        lines.append(
            f"| {key} | {slope} | {drift} | {low} | {high} | {'yes' if fit['flat'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(args: Args) -> dict[str, Any]:
    """Run the soak, print the tables, save the JSON; returns the JSON dict."""
    if args.num_envs % args.num_stages:
        raise ValueError("num_envs must be a multiple of num_stages (equal stages)")
    fns = [partial(CountingEnv, i, args.episode_length, args.kind) for i in range(args.num_envs)]
    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    envs = PipelinedVectorEnv(fns, num_stages=args.num_stages, envs_per_worker=args.envs_per_worker)
    samples: list[dict[str, Any]] = []
    try:
        stage_size = args.num_envs // args.num_stages
        rng = np.random.default_rng(0)
        actions = [rng.integers(0, 3, size=stage_size) for _ in range(64)]
        rounds = max(1, args.steps // args.num_envs)
        sample_every = max(1, rounds // args.samples)
        start = time.perf_counter()
        envs.reset(seed=0)
        samples.append(sample(0, start))
        for s in range(args.num_stages):
            envs.step_async(actions[s % 64], stage=s)
        for r in range(1, rounds + 1):
            for s in range(args.num_stages):
                envs.step_wait(stage=s)
                if r % 1000 == s + 1:  # now and then: a stage reset and a call
                    envs.reset_async(seed=r, stage=s)
                    envs.reset_wait(stage=s)
                    envs.call_at([envs.stage_slices[s].start], "__getattribute__", "count")
                if r < rounds:
                    envs.step_async(actions[(r + s) % 64], stage=s)
            if r % sample_every == 0 or r == rounds:
                samples.append(sample(r * args.num_envs, start))
        elapsed = time.perf_counter() - start
    finally:
        envs.close()
    total_steps = rounds * args.num_envs
    analysis = analyse(samples, int(args.warmup_fraction * total_steps), args.flat_bytes)
    result = {
        "benchmark": "soak",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(args).items()},
        "machine": {
            **machine_identity(),
            **machine_info(),
            "load_average_1m_at_start": load_at_start,
            "load_average_1m_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        },
        "env_steps": total_steps,
        "seconds": elapsed,
        "env_steps_per_s": total_steps / elapsed,
        "flat": all(fit["flat"] for fit in analysis["fits"].values()),
        **analysis,
        "samples": samples,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(relative_paths(result), indent=2))
    print(format_table(samples, analysis))
    print(
        f"\n{total_steps:,} env steps in {elapsed:.0f} s ({result['env_steps_per_s']:,.0f} steps/s); "
        f"flat: {'yes' if result['flat'] else 'NO'}; load average {load_at_start} -> "
        f"{result['machine']['load_average_1m_at_end']}"
    )
    print(f"saved {args.output}")
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
