"""Decoupled inference (InferenceChannel) vs synchronous whole-batch stepping, long-tail envs.

Every env's step sleeps a lognormal time (median ``median_ms``, shape ``sigma``; the
default ``sigma=0.99`` puts the 99th percentile at 10x the median), drawn from the env's
own seeded generator, so every mode sees the same latency sequence per env. Sleeping
stands for a simulator whose step time varies (contacts, resets, rendering); it is the
variance that matters here, and sleeping keeps the numbers independent of how many cores
the machine has. Inference costs ``a + b * batch`` seconds, also slept (off-CPU: a GPU),
with the same ``a`` and ``b`` everywhere:

- **sync**: ``infer(N); envs.step(all N)`` per round. Each round waits for the slowest
  of ``N`` envs.
- **staged-2**: two pipeline stages in round robin (``step_async``/``step_wait`` per
  stage), inferring one stage while the other steps. Each stage still waits for its
  slowest env.
- **decoupled**: `InferenceChannel` with 1, 2, 3 actors
  (one device each), several ``rollout_queue_size`` values and ``max_wait`` 0, plus one
  row per actor count with a few ms of ``max_wait``. Each env goes on as soon as its own
  action is back.

Every mode runs ``steps`` steps per env from the same reset. Modes are measured in rounds
(each round visits every mode once, reusing one vector env), and the table shows the
median over rounds, so drift on a shared machine spreads over all modes.

Ceilings printed next to the measured numbers (from the latency distribution, by
sampling): sync ``N / (E[max of N] + a + b N)``; decoupled with ample actors
``N / (E[latency] + a + b)``: an env cannot go faster than its own step plus one
inference.

Run::

    python benchmarks/decoupled.py                 # default, < 3 minutes
    python benchmarks/decoupled.py --steps 400 --rounds 3
    python benchmarks/decoupled.py --help

Results go to ``benchmarks/results/decoupled.json`` with the machine's description.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import tyro
from gymnasium import spaces

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.stepping.channel import InferenceChannel

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import machine_identity, relative_paths  # noqa: E402

__all__ = ["Args", "LongTailEnv", "main"]

# Loaded by path (tests), worker processes cannot import this module by name.
if __name__ != "__main__":
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

RESULTS = Path(__file__).resolve().parent / "results" / "decoupled.json"


@dataclass
class Args:
    """Decoupled-inference benchmark options (the defaults run in under three minutes)."""

    num_envs: int = 16
    """Envs, one per worker process (``N``; the same on every side)."""
    steps: int = 100
    """Steps per env per measured run."""
    rounds: int = 2
    """Rounds; each runs every mode once. Medians are reported."""
    median_ms: float = 10.0
    """Median env step time (ms)."""
    sigma: float = 0.99
    """Lognormal shape of the step time; p99 / median = exp(2.326 sigma) (0.99: ~10x)."""
    episode_length: int = 100
    """Steps per episode (each reset also sleeps one median step)."""
    infer_a_ms: float = 4.0
    """Fixed cost of one inference call (ms)."""
    infer_b_ms: float = 0.25
    """Cost per env in an inference call (ms)."""
    actors: tuple[int, ...] = (1, 2, 3)
    """Actor counts for the decoupled runs."""
    queue_sizes: tuple[int, ...] = (1, 4, 0)
    """``rollout_queue_size`` values (0: ceil(workers / actors))."""
    max_wait_ms: float = 0.0
    """Actor ``max_wait`` (ms) of the runs above."""
    extra_max_wait_ms: float = 2.0
    """Also run each actor count with the default queue size and this ``max_wait`` (ms);
    0 skips these rows."""
    staged: bool = True
    """Also measure the two-stage pipelined loop."""
    out: Path = RESULTS
    """Where to write the JSON."""


class LongTailEnv(gym.Env):
    """An env whose step sleeps a lognormal time drawn from its seeded ``np_random``.

    Observation float32 ``(8,)``; action Box ``(2,)``; reward 0; truncates after
    ``episode_length`` steps.

    Args:
        median_s: Median step time (s).
        sigma: Lognormal shape.
        episode_length: Steps per episode.
    """

    def __init__(self, median_s: float, sigma: float, episode_length: int) -> None:
        self.median_s = median_s
        self.sigma = sigma
        self.episode_length = episode_length
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(8,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        time.sleep(self.median_s)
        return np.zeros(8, dtype=np.float32), {}

    def step(self, action: Any):
        time.sleep(self.median_s * float(np.exp(self.sigma * self.np_random.standard_normal())))
        self.t += 1
        obs = np.full(8, self.t, dtype=np.float32)
        return obs, 0.0, False, self.t >= self.episode_length, {}


class SleepPolicy:
    """The inference cost model: sleeps ``a + b * batch`` seconds and returns zeros."""

    def __init__(self, a: float, b: float) -> None:
        self.a, self.b = a, b

    def __call__(self, obs: np.ndarray, env_ids: np.ndarray | None = None) -> np.ndarray:
        time.sleep(self.a + self.b * len(obs))
        return np.zeros((len(obs), 2), dtype=np.float32)


def run_sync(envs: PipelinedVectorEnv, policy: SleepPolicy, steps: int) -> dict[str, Any]:
    obs, _ = envs.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        obs, *_ = envs.step(policy(obs))
    wall = time.perf_counter() - start
    n = envs.num_envs
    return {"steps_per_s": n * steps / wall, "wall_s": wall, "mean_batch": float(n)}


def run_staged(envs: PipelinedVectorEnv, policy: SleepPolicy, steps: int) -> dict[str, Any]:
    """Two stages in round robin: infer stage s while the other stage steps."""
    obs, _ = envs.reset(seed=0)
    stages = range(envs.num_stages)
    start = time.perf_counter()
    for s in stages:
        envs.step_async(policy(obs[envs.stage_slices[s]]), stage=s)
    for t in range(steps):
        for s in stages:
            obs_s, *_ = envs.step_wait(stage=s)
            if t + 1 < steps:
                envs.step_async(policy(obs_s), stage=s)
    wall = time.perf_counter() - start
    n = envs.num_envs
    return {"steps_per_s": n * steps / wall, "wall_s": wall, "mean_batch": n / envs.num_stages}


def run_decoupled(
    envs: PipelinedVectorEnv,
    policy: SleepPolicy,
    steps: int,
    actors: int,
    queue_size: int,
    max_wait: float,
) -> dict[str, Any]:
    with InferenceChannel(
        envs, [policy] * actors, rollout_queue_size=queue_size, max_wait=max_wait
    ) as channel:
        channel.reset(seed=0)
        rollout = channel.run(steps, record=False, timeout=60)
        effective_queue = channel.rollout_queue_size
    n = envs.num_envs
    sizes = [s for st in rollout.actor_stats for s in st.batch_sizes]
    waits = np.array([w for st in rollout.actor_stats for w in st.queue_waits]) * 1e3
    turn = np.array(rollout.turnaround) * 1e3
    return {
        "steps_per_s": n * steps / rollout.wall_seconds,
        "wall_s": rollout.wall_seconds,
        "rollout_queue_size": effective_queue,
        "mean_batch": float(np.mean(sizes)),
        "per_actor_mean_batch": [st.summary()["mean_batch"] for st in rollout.actor_stats],
        "per_actor_calls": [len(st.batch_sizes) for st in rollout.actor_stats],
        "mean_queue_wait_ms": float(waits.mean()),
        "p99_queue_wait_ms": float(np.percentile(waits, 99)),
        "mean_turnaround_ms": float(turn.mean()),
    }


def ceilings(args: Args) -> dict[str, float]:
    """Throughput bounds (env steps/s) implied by the latency distribution and cost model."""
    rng = np.random.default_rng(0)
    lat = args.median_ms * np.exp(args.sigma * rng.standard_normal((20_000, args.num_envs)))
    a, b, n = args.infer_a_ms, args.infer_b_ms, args.num_envs
    return {
        "sync": n / (lat.max(axis=1).mean() + a + b * n) * 1e3,
        "decoupled": n / (lat.mean() + a + b) * 1e3,
        "p99_over_median": float(np.percentile(lat, 99) / args.median_ms),
    }


def main(args: Args) -> dict[str, Any]:
    policy = SleepPolicy(args.infer_a_ms * 1e-3, args.infer_b_ms * 1e-3)
    fns = [
        lambda: LongTailEnv(args.median_ms * 1e-3, args.sigma, args.episode_length)
        for _ in range(args.num_envs)
    ]
    modes: list[tuple[str, dict[str, Any]]] = [("sync", {})]
    if args.staged:
        modes.append(("staged-2", {}))
    for k in args.actors:
        for q in args.queue_sizes:
            modes.append(
                (
                    f"decoupled a={k} q={q or 'default'}",
                    {"actors": k, "queue_size": q, "max_wait_ms": args.max_wait_ms},
                )
            )
        if args.extra_max_wait_ms > 0:
            modes.append(
                (
                    f"decoupled a={k} q=default w={args.extra_max_wait_ms:g}ms",
                    {"actors": k, "queue_size": 0, "max_wait_ms": args.extra_max_wait_ms},
                )
            )
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in modes}
    one_stage = PipelinedVectorEnv(fns, envs_per_worker=1)  # an actor needs a worker each
    two_stage = PipelinedVectorEnv(fns, num_stages=2, envs_per_worker=1) if args.staged else None
    try:
        for r in range(args.rounds):
            for name, kw in modes:
                if name == "sync":
                    result = run_sync(one_stage, policy, args.steps)
                elif name == "staged-2":
                    assert two_stage is not None
                    result = run_staged(two_stage, policy, args.steps)
                else:
                    result = run_decoupled(
                        one_stage,
                        policy,
                        args.steps,
                        kw["actors"],
                        kw["queue_size"],
                        kw["max_wait_ms"] * 1e-3,
                    )
                samples[name].append(result)
                print(
                    f"round {r}: {name:<32} {result['steps_per_s']:8.1f} steps/s", file=sys.stderr
                )
    finally:
        one_stage.close()
        if two_stage is not None:
            two_stage.close()

    bounds = ceilings(args)
    sync_rate = statistics.median(s["steps_per_s"] for s in samples["sync"])
    rows = []
    for name, kw in modes:
        runs = samples[name]
        rate = statistics.median(s["steps_per_s"] for s in runs)
        best = min(runs, key=lambda s: abs(s["steps_per_s"] - rate))  # the median run's details
        rows.append(
            {
                "mode": name,
                **kw,
                **best,
                "steps_per_s": rate,
                "all_steps_per_s": [s["steps_per_s"] for s in runs],
                "speedup_vs_sync": rate / sync_rate,
            }
        )
    report = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
        "ceilings_steps_per_s": bounds,
        "rows": rows,
        "machine": {
            **machine_identity(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else None,
            "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "gymnasium": metadata.version("gymnasium"),
            "numpy": metadata.version("numpy"),
        },
    }
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(relative_paths(report), indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return report


def markdown_table(report: dict[str, Any]) -> str:
    """The rows of ``report`` (the JSON this script writes) as a Markdown table: env
    steps/s, the ratio to sync, the queue size, the mean batch (per actor) and the queue
    wait in ms (mean / p99)."""
    lines = [
        "| mode | steps/s | x sync | q | mean batch | per actor | queue wait ms (mean / p99) |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in report["rows"]:
        wait = (
            f"{r['mean_queue_wait_ms']:.2f} / {r['p99_queue_wait_ms']:.2f}"
            if "mean_queue_wait_ms" in r
            else ""
        )
        cells = [
            r["mode"],
            f"{r['steps_per_s']:.1f}",
            f"{r['speedup_vs_sync']:.2f}",
            str(r.get("rollout_queue_size", "")),
            f"{r['mean_batch']:.1f}",
            "/".join(f"{b:.1f}" for b in r.get("per_actor_mean_batch", [])),
            wait,
        ]
        lines.append("|" + "".join(f" {cell} |" if cell else " |" for cell in cells))
    return "\n".join(lines)


def print_table(report: dict[str, Any]) -> None:
    a = report["args"]
    c = report["ceilings_steps_per_s"]
    print(
        f"\n{a['num_envs']} envs, step lognormal median {a['median_ms']} ms sigma {a['sigma']} "
        f"(p99/median {c['p99_over_median']:.1f}), inference {a['infer_a_ms']} + "
        f"{a['infer_b_ms']} x batch ms, {a['steps']} steps/env, median of {a['rounds']} rounds"
    )
    print(
        f"ceilings: sync {c['sync']:.0f} steps/s, decoupled {c['decoupled']:.0f} steps/s "
        f"(x{c['decoupled'] / c['sync']:.2f})\n"
    )
    header = f"{'mode':<32} {'steps/s':>8} {'x sync':>7} {'q':>3} {'batch':>6} {'per actor':>16} {'wait ms':>8} {'p99 ms':>7}"
    print(header)
    print("-" * len(header))
    for r in report["rows"]:
        per_actor = "/".join(f"{b:.1f}" for b in r.get("per_actor_mean_batch", []))
        q = r.get("rollout_queue_size", "")
        wait = f"{r['mean_queue_wait_ms']:.2f}" if "mean_queue_wait_ms" in r else ""
        p99 = f"{r['p99_queue_wait_ms']:.2f}" if "p99_queue_wait_ms" in r else ""
        print(
            f"{r['mode']:<32} {r['steps_per_s']:>8.1f} {r['speedup_vs_sync']:>7.2f} {q!s:>3} "
            f"{r['mean_batch']:>6.1f} {per_actor:>16} {wait:>8} {p99:>7}"
        )


if __name__ == "__main__":
    main(tyro.cli(Args))
