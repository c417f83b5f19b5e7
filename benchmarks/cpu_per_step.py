"""CPU time per env step of `PipelinedVectorEnv`, caller and workers, for A/B of core trees.

Wall-clock rates on a shared machine swing with the load; the CPU time a step costs
swings much less. This script measures, for 8 envs (``--num-envs``) stepped with fixed
actions:

- **parent**: CPU time of this process (``time.process_time``) per env step;
- **workers**: CPU time of the worker processes (Linux ``/proc/<pid>/schedstat``) per
  env step;

for a few cases: a null env (a 17-float observation, 6-float actions, two float infos,
nothing computed: pure framework cost) and ``HalfCheetah-v5``, each with whole-env
``step``, the staged loop (``step_async``/``step_wait`` per stage, every stage kept in
flight) or the EnvPool-style loop (``async_reset``, then ``recv(batch_size=num_envs //
2)`` and ``send`` of those envs' actions; its steps counted in env results received), in
``STAGESxENVS_PER_WORKER`` layouts.

With ``--trees A B ...`` every case runs once per tree per round, alternating, each run
in a fresh subprocess whose ``PYTHONPATH`` starts with that tree (a directory holding a
``pipelined_vec_env`` package, e.g. ``mkdir -p /tmp/base && git archive <commit> pipelined_vec_env | tar -x -C
/tmp/base``), and the medians over ``--rounds`` are printed side by side: the before /
after figures of a change to the core, under the same load. Without ``--trees`` the
installed (or ``PYTHONPATH``'s) package is measured in this process. ``--profile`` adds
a cProfile of the parent for one case (``--profile-case``), sorted by self time;
``--summary`` runs every case once more with the package's own profiler on and prints
where the wall time went (the caller's work and its waits by name, the workers' steps,
transport).

Run::

    python benchmarks/cpu_per_step.py                       # the package on the path
    python benchmarks/cpu_per_step.py --trees /tmp/base .   # before / after, side by side
    python benchmarks/cpu_per_step.py --profile --profile-case null-1x4-step
    python benchmarks/cpu_per_step.py --cases cheetah-1x4-step cheetah-1x4-sendrecv --summary
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import tyro
from gymnasium import spaces

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import python_in_tree, relative_paths, workers_cpu_seconds  # noqa: E402

__all__ = ["Args", "NullInfoEnv", "main", "measure", "profile_shares"]

if __name__ != "__main__":  # loaded by path (tests): ship the env class by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

LOOPS = ("step", "staged", "sendrecv")
DEFAULT_CASES = ("null-1x4-step", "null-2x4-staged", "null-1x8-step", "cheetah-1x4-step")


@dataclass
class Args:
    """CPU-per-env-step options."""

    cases: tuple[str, ...] = DEFAULT_CASES
    """Cases as ``ENV-STAGESxENVS_PER_WORKER-LOOP``: ENV ``null`` or ``cheetah``
    (HalfCheetah-v5), LOOP ``step`` (whole-env), ``staged`` or ``sendrecv``."""
    trees: tuple[Path, ...] = ()
    """Core trees to compare (each run in a subprocess with it first on PYTHONPATH);
    empty: the package importable here, in this process."""
    rounds: int = 3
    """Runs of every case (and tree); medians are printed."""
    steps: int = 3000
    """Vector steps timed per run (HalfCheetah cases: half as many)."""
    warmup: int = 50
    """Vector steps before timing."""
    num_envs: int = 8
    """Envs per vector env."""
    profile: bool = False
    """Also print a cProfile of the parent (self time) for ``profile_case``."""
    profile_case: str = "null-1x4-step"
    """The case profiled with ``--profile``."""
    summary: bool = False
    """Also run every case once more with the package's profiler on (``profile=True``,
    the package importable here) and print where its wall time went: the caller's own
    share, its waits by name, the workers' stepping share and median step, transport's
    share of the workers' commands, and the profiler's bottleneck sentence."""
    output: Path | None = None
    """Also write the results here as JSON."""


class NullInfoEnv(gym.Env):
    """An env whose ``step`` computes nothing, shaped like a small MuJoCo task: a 17-float
    observation, a 6-float ``Box`` action, two float infos; never done."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(17,), dtype=np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(6,), dtype=np.float32)
        self._obs = np.zeros(17)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return self._obs, {}

    def step(self, action: Any):
        return self._obs, 0.0, False, False, {"x_position": 0.1, "reward_ctrl": -0.2}


def _parse_case(case: str) -> tuple[str, int, int, str]:
    try:
        env, layout, loop = case.split("-")
        stages, per_worker = (int(x) for x in layout.lower().split("x"))
    except ValueError:
        raise ValueError(
            f"case: expected ENV-SxW-LOOP such as 'null-1x4-step', got {case!r}"
        ) from None
    if env not in ("null", "cheetah") or loop not in LOOPS:
        raise ValueError(f"case: ENV null|cheetah and LOOP step|staged|sendrecv, got {case!r}")
    return env, stages, per_worker, loop


def measure(
    case: str,
    steps: int,
    warmup: int = 50,
    num_envs: int = 8,
    profile: bool = False,
    summary: bool = False,
) -> dict[str, Any]:
    """Time ``steps`` vector steps of ``case`` in this process (``profile``: under
    cProfile, whose table is printed; ``summary``: with the package's profiler on).

    Returns:
        ``parent_us`` and ``workers_us`` (CPU per env step), ``wall_us`` (wall time per
        env step), ``envs_per_call`` (env steps per ``step``, stage wait or ``recv``),
        ``load`` (1-minute load average at the end) and ``package`` (the directory of the
        ``pipelined_vec_env`` measured); with ``summary`` also ``profile``
        (`profile_shares`).
    """
    import pipelined_vec_env
    from pipelined_vec_env import PipelinedVectorEnv

    env, stages, per_worker, loop = _parse_case(case)
    if env == "null":
        fn: Any = NullInfoEnv
    else:

        def fn() -> gym.Env:
            return gym.make("HalfCheetah-v5")

    envs = PipelinedVectorEnv(
        [fn] * num_envs, num_stages=stages, envs_per_worker=per_worker, profile=summary
    )
    try:
        envs.reset(seed=0)
        space = envs.single_action_space
        rng = np.random.default_rng(0)
        actions = rng.uniform(-1, 1, size=(64, num_envs, *space.shape)).astype(space.dtype)
        slices = envs.stage_slices

        # each loop returns (env steps, calls): whole-env steps, stage waits or recvs

        def whole(n: int) -> tuple[int, int]:
            for i in range(n):
                envs.step(actions[i % 64])
            return n * num_envs, n

        def staged(n: int) -> tuple[int, int]:
            for s, sl in enumerate(slices):
                envs.step_async(actions[0][sl], stage=s)
            for i in range(1, n):
                batch = actions[i % 64]
                for s, sl in enumerate(slices):
                    envs.step_wait(stage=s)
                    envs.step_async(batch[sl], stage=s)
            for s in range(len(slices)):
                envs.step_wait(stage=s)
            return n * num_envs, n * len(slices)

        def send_recv(n: int) -> tuple[int, int]:
            # at least n vector steps' worth of env results (the last recv may bring more)
            received = calls = 0
            while received < n * num_envs:
                *_, infos = envs.recv(batch_size=num_envs // 2)
                ids = infos["env_id"]
                envs.send(actions[received // num_envs % 64][: len(ids)], ids)
                received += len(ids)
                calls += 1
            return received, calls

        run = {"step": whole, "staged": staged, "sendrecv": send_recv}[loop]
        if loop == "sendrecv":
            envs.async_reset(seed=0)
        run(warmup)
        if summary:
            envs.profiler.clear()  # the timed steps only
        # `workers`; `_handles` in older checkouts (--trees runs older ones)
        handles = getattr(envs, "workers", None) or envs._handles
        pids = [h.pid for h in handles]
        workers, cpu, wall = workers_cpu_seconds(pids), time.process_time(), time.perf_counter()
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        n, calls = run(steps)
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        workers = workers_cpu_seconds(pids) - workers
        shares = profile_shares(envs.profiler) if summary else None
    finally:
        envs.close()
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(40)
    result = {
        "parent_us": cpu / n * 1e6,
        "workers_us": workers / n * 1e6,
        "wall_us": wall / n * 1e6,
        "envs_per_call": n / calls,
        "load": os.getloadavg()[0],
        "package": str(Path(pipelined_vec_env.__file__).resolve().parent),
    }
    if shares is not None:
        result["profile"] = shares
    return result


def profile_shares(profiler: Any) -> dict[str, Any]:
    """Where the wall time of a profiled run went, from its `Profiler`'s summary and
    records: ``caller_busy`` (share of wall time outside the caller's recorded waits),
    ``caller_waits`` (share per wait name: ``recv``, ``hand-over``, a stage's wait ...),
    ``workers_stepping`` (mean over workers of the share spent in their commands),
    ``step_p50_us`` (median worker step), ``transport`` (the summary's
    ``transport_fraction``: transport's share of transport plus worker time) and
    ``bottleneck_reason``."""
    summary = profiler.summary()
    wall_ns = max(summary["wall_s"] * 1e9, 1.0)
    waits: dict[str, float] = {}
    for name, _stage, t0, t1 in profiler.records()["waits"]:
        waits[name] = waits.get(name, 0.0) + (t1 - t0) / wall_ns
    workers = summary["workers"].values()
    steps = [w["step_p50_s"] for w in workers if w["step_p50_s"] is not None]
    return {
        "caller_busy": summary["caller_busy_fraction"],
        "caller_waits": dict(sorted(waits.items())),
        "workers_stepping": statistics.mean(w["busy_fraction"] for w in workers),
        "step_p50_us": statistics.median(steps) * 1e6 if steps else None,
        "transport": summary["transport_fraction"],
        "bottleneck_reason": summary["bottleneck_reason"],
    }


def _in_subprocess(tree: Path, case: str, steps: int, args: Args) -> dict[str, Any]:
    code = (
        "import json, runpy, sys; "
        f"m = runpy.run_path({str(Path(__file__).resolve())!r}); "
        f"print('RESULT', json.dumps(m['measure']({case!r}, {steps}, {args.warmup}, "
        f"{args.num_envs})))"
    )
    out = python_in_tree(tree, code)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{case} with {tree} failed:\n{out.stderr[-2000:]}")


def _steps(case: str, args: Args) -> int:
    """Vector steps timed for ``case``: ``args.steps``, half as many for HalfCheetah."""
    return args.steps if case.startswith("null") else max(1, args.steps // 2)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the cases (per tree, alternating), print the medians side by side."""
    args = tyro.cli(Args, args=argv)
    for case in args.cases:
        _parse_case(case)
    labels = [str(t) for t in args.trees] or ["installed"]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    load_start = os.getloadavg()
    for _ in range(args.rounds):
        for case in args.cases:
            steps = _steps(case, args)
            for label, tree in zip(labels, args.trees or [None], strict=True):
                result = (
                    measure(case, steps, args.warmup, args.num_envs)
                    if tree is None
                    else _in_subprocess(tree, case, steps, args)
                )
                results.setdefault(case, {}).setdefault(label, []).append(result)
    load_end = os.getloadavg()
    print(f"load average at start {load_start}, at end {load_end}")
    summary: dict[str, Any] = {}
    for case, by_tree in results.items():
        line = f"{case}:"
        for label, runs in by_tree.items():
            med = {
                k: statistics.median(r[k] for r in runs)
                for k in ("parent_us", "workers_us", "wall_us", "envs_per_call")
            }
            summary.setdefault(case, {})[label] = {
                **med,
                "package": runs[0]["package"],
                "runs": runs,
            }
            line += (
                f"  [{label}] parent {med['parent_us']:.1f} + workers {med['workers_us']:.1f}"
                f" = {med['parent_us'] + med['workers_us']:.1f} us (wall {med['wall_us']:.1f};"
                f" {med['envs_per_call']:.1f} envs a call)"
            )
        print(line)
    profiles: dict[str, Any] = {}
    if args.summary:
        for case in args.cases:
            steps = _steps(case, args)
            shares = measure(case, steps, args.warmup, args.num_envs, summary=True)["profile"]
            profiles[case] = shares
            waits = ", ".join(f"{k} {v:.0%}" for k, v in shares["caller_waits"].items())
            print(
                f"{case} profiled: caller busy {shares['caller_busy']:.0%} (waits: {waits});"
                f" workers stepping {shares['workers_stepping']:.0%}, median step"
                f" {shares['step_p50_us']:.0f} us; transport {shares['transport']:.0%}"
            )
    if args.profile:
        print(f"cProfile of the parent, {args.profile_case}:")
        measure(args.profile_case, args.steps, args.warmup, args.num_envs, profile=True)
    output = {"load_start": load_start, "load_end": load_end, "cases": summary}
    if profiles:
        output["profiles"] = profiles
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(relative_paths(output), indent=1) + "\n")
    return output


if __name__ == "__main__":
    main()
