"""What the pipeline profiler costs: env-step throughput with ``profile=False`` and
``profile=True``, and (optionally) of a checkout without the profiler, side by side.

Each variant runs in its own child process (``--baseline PATH`` puts another checkout's
``pipelined_vec_env`` first on ``PYTHONPATH`` for the ``baseline`` variant); rounds visit
every variant in turn, so slow drift on a shared machine spreads over all of them. A child
builds ``num_envs`` envs (``HalfCheetah-v5`` by default: a light MuJoCo env, so framework
costs show), steps them with pre-drawn random actions for a warm-up, then times
``--steps`` whole-env steps. Ratios are medians of per-round paired ratios.

Run::

    python benchmarks/profiler_overhead.py --baseline /path/to/checkout/without/profiler
    python benchmarks/profiler_overhead.py --rounds 7 --steps 3000

Results go to ``benchmarks/results/profiler_overhead.json``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _children import run_child_json  # noqa: E402
from _machine import cpu_model, machine_identity, package_versions, relative_paths  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "profiler_overhead.json"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Args:
    """Profiler overhead benchmark options."""

    env_id: str = "HalfCheetah-v5"
    """gymnasium id of the env."""
    num_envs: int = 8
    """Envs (one worker each)."""
    steps: int = 2000
    """Timed whole-env steps per round and variant."""
    warmup: int = 200
    """Untimed steps first."""
    rounds: int = 5
    """Rounds; each runs every variant once."""
    baseline: str | None = None
    """A checkout without the profiler (its directory holding ``pipelined_vec_env``):
    adds the ``baseline`` variant."""
    output: Path = RESULTS
    """JSON results file."""
    child: str | None = None
    """Internal: run one variant (``off``, ``on`` or ``baseline``) and print its result."""


def run_child(args: Args) -> dict[str, float]:
    """Time one variant in this process (see the module doc)."""
    import gymnasium as gym
    import numpy as np

    import pipelined_vec_env
    from pipelined_vec_env import PipelinedVectorEnv

    kwargs = {} if args.child == "baseline" else {"profile": args.child == "on"}
    envs = PipelinedVectorEnv(
        [lambda: gym.make(args.env_id) for _ in range(args.num_envs)], **kwargs
    )
    try:
        rng = np.random.default_rng(0)
        low, high = envs.action_space.low, envs.action_space.high
        actions = rng.uniform(low, high, size=(args.warmup + args.steps, *low.shape)).astype(
            envs.action_space.dtype
        )
        envs.reset(seed=0)
        for t in range(args.warmup):
            envs.step(actions[t])
        cpu0, t0 = time.process_time(), time.perf_counter()
        for t in range(args.warmup, args.warmup + args.steps):
            envs.step(actions[t])
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        result = {
            "env_steps_per_s": args.steps * args.num_envs / wall,
            "caller_cpu_us_per_step": 1e6 * cpu / args.steps,
            "package": str(Path(pipelined_vec_env.__file__).parent),
        }
        if args.child == "on":
            summary = envs.profiler.summary()
            result["bottleneck"] = summary["bottleneck"]
            result["commands_recorded"] = sum(w["commands"] for w in summary["workers"].values())
        return result
    finally:
        envs.close()


def record_costs(num_workers: int, repeats: int = 20000) -> dict[str, float]:
    """In-process CPU cost of what profiling adds per command, in microseconds (thread CPU
    time, so steadier on a loaded machine than throughput).

    ``off_added_us``: with profiling off, what the worker adds per command (a length
    check of the command and a branch). ``on_added_us``: the record methods of one step
    of ``num_workers`` workers (send and answer per worker, stage start/wait/finish), per
    command, plus the timed answer's extra pickling (worker times and the flag).
    """
    import pickle

    import numpy as np

    sys.path.insert(0, str(REPO))  # this checkout's package, not an installed one
    from pipelined_vec_env.profiling.profiler import Profiler

    result = (None, [0.0], [False], [False], [[{}]])
    obs = np.zeros(17)
    answer2 = ("ok", (*result[:1], [0.1], [False], [False], [[{"x": obs}]]))

    def timed(fn) -> float:  # CPU time of this thread: preemption by other jobs excluded
        t0 = time.thread_time()
        for _ in range(repeats):
            fn()
        return 1e6 * (time.thread_time() - t0) / repeats

    def plain() -> None:
        pickle.loads(pickle.dumps(answer2, protocol=pickle.HIGHEST_PROTOCOL))

    def off() -> None:  # the worker's loop with profiling off: the same answer
        message = ("step", None)
        timed = len(message) > 2
        started = time.monotonic_ns() if timed else 0
        a = ("ok", answer2[1], (started, time.monotonic_ns())) if timed else answer2
        pickle.loads(pickle.dumps(a, protocol=pickle.HIGHEST_PROTOCOL))

    def on() -> None:
        message = ("step", None, True)
        timed = len(message) > 2
        started = time.monotonic_ns() if timed else 0
        a = ("ok", answer2[1], (started, time.monotonic_ns())) if timed else answer2
        pickle.loads(pickle.dumps(a, protocol=pickle.HIGHEST_PROTOCOL))[:2]

    profiler = Profiler(enabled=True, max_records=10 * repeats * num_workers)
    for w in range(num_workers):
        profiler.add_worker(w, 0, (w,))

    def one_step() -> None:
        for w in range(num_workers):
            profiler.command_sent(w, "step")
        profiler.stage_started(0, "step")
        profiler.wait_started(0)
        now = time.monotonic_ns()
        for w in range(num_workers):
            profiler.answer_received(w, "ok", (now, now))
        profiler.stage_finished(0)

    best: dict[str, float] = {}
    for _ in range(15):  # interleaved, best of 15: load spikes hit every variant alike
        for name, fn in (("plain", plain), ("off", off), ("on", on), ("step", one_step)):
            best[name] = min(best.get(name, float("inf")), timed(fn))
    return {
        "off_added_us": max(0.0, best["off"] - best["plain"]),
        "on_added_us": best["step"] / num_workers + max(0.0, best["on"] - best["plain"]),
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; print a table and write the JSON results."""
    args = tyro.cli(Args, args=argv)
    if args.child is not None:
        print(json.dumps(run_child(args)))
        return {}
    variants = ["off", "on"] + (["baseline"] if args.baseline else [])
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            argv = ["--child", v, "--env-id", args.env_id, "--num-envs", str(args.num_envs)]
            argv += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
            path = args.baseline if v == "baseline" else str(REPO)
            runs[v].append(run_child_json(__file__, argv, path))
            print(
                f"round {r}: {v:8s} {runs[v][-1]['env_steps_per_s']:9.0f} env steps/s", flush=True
            )

    def median(v: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[v])

    def paired(a: str, b: str) -> float:
        return statistics.median(
            x["env_steps_per_s"] / y["env_steps_per_s"]
            for x, y in zip(runs[a], runs[b], strict=True)
        )

    ratios = {"on / off": paired("on", "off")}
    if args.baseline:
        ratios["off / baseline"] = paired("off", "baseline")
        ratios["on / baseline"] = paired("on", "baseline")
    costs = record_costs(args.num_envs)
    step_us = 1e6 * args.num_envs / median("off", "env_steps_per_s")  # one whole-env step
    costs["off_fraction_of_step"] = costs["off_added_us"] * args.num_envs / step_us
    costs["on_fraction_of_step"] = costs["on_added_us"] * args.num_envs / step_us
    table = {
        v: {
            "env_steps_per_s": median(v, "env_steps_per_s"),
            "caller_cpu_us_per_step": median(v, "caller_cpu_us_per_step"),
        }
        for v in variants
    }
    print(f"\n{args.env_id}, {args.num_envs} envs, {args.steps} steps x {args.rounds} rounds")
    print(f"{'variant':10s} {'env steps/s':>12s} {'caller CPU us/step':>18s}")
    for v, row in table.items():
        print(f"{v:10s} {row['env_steps_per_s']:12.0f} {row['caller_cpu_us_per_step']:18.1f}")
    for name, value in ratios.items():
        print(f"{name:16s} {value:.3f}")
    print(
        f"added per command: off {costs['off_added_us']:.2f} us, on {costs['on_added_us']:.2f} us "
        f"(caller-side share of a whole-env step, all commands: off "
        f"{costs['off_fraction_of_step']:.2%}, on {costs['on_fraction_of_step']:.2%})"
    )
    baseline_commit = None
    if args.baseline:
        baseline_commit = (
            subprocess.run(
                ["git", "-C", args.baseline, "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or None
        )
    result = {
        "args": {k: str(v) for k, v in asdict(args).items()},
        "table": table,
        "paired_ratios": ratios,
        "record_costs": costs,
        "runs": runs,
        "baseline_commit": baseline_commit,
        "machine": {
            **machine_identity(),
            "cpu": cpu_model(),
            "cores": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "load_average_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "python": platform.python_version(),
            "packages": package_versions(["gymnasium", "mujoco", "numpy"]),
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(relative_paths(result), indent=2))
    return result


if __name__ == "__main__":
    main()
