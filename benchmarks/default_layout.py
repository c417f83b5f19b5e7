"""The default layout against the best explicit layout, per workload, side by side.

For each workload, every layout is built once, then timed in interleaved rounds (each
round visits every layout in turn), so drift on a shared machine spreads over all of them;
the ratio of the default to the best layout is the median of the per-round paired
ratios. An explicit layout equal to the default's is not built twice: the default is that
layout's row (timing one layout twice measures only the noise), and it is the best when
no other layout is faster (ratio 1). After the rounds, each default layout's `step_profiles` (serial or
concurrent stepping, and why) is recorded. Workloads:

- **halfcheetah-8 / halfcheetah-32**: ``HalfCheetah-v5``, whole-env ``step`` with random
  actions (`throughput.prepare_vector`); explicit ``envs_per_worker`` 1/2/4/8 (8 envs) or
  4/8/16/32 (32 envs). Target: the default >= 0.95 of the best.
- **latency step / latency recv-send**: 8 `LatencyEnv` (step sleeps a lognormal time,
  median 5 ms, p99 about 10x), a policy sleeping 3 ms + 0.5 ms per observation
  (`throughput.SleepPolicy`, as in `throughput.measure_decoupled`); the whole-env ``step``
  loop, and ``recv(4)``/``send``. Against one env per worker; target >= 0.95.
- **heavy-offcpu 2 / 4 stages**: `rollout_overlap.py --workload offcpu`'s workload: 4
  `BusyEnv` (4 ms of CPU per step), a policy sleeping 2 ms per observation, the staged
  round robin of `measure_layout`; explicit one env per worker and one worker per stage.
  Target >= 0.95 of the best.
- **halfcheetah-8 2 stages**: 8 ``HalfCheetah-v5`` in 2 stages, the staged round robin
  with a policy sleeping 0.5 ms per observation: what a light env pays for the default's
  one worker per core in each stage. Explicit 1/2/4 per worker; target >= 0.95 of the best.
- **libero state-only / libero cameras** (``--libero``): 4 ``libero_spatial`` task-0 envs,
  state-only, or with the agentview and wrist cameras at 224x224; whole-env ``step`` with
  random actions (`libero_step._make_registered`); against one env per worker, target
  >= 1.0 (no slower; the median paired ratio).
- **libero memory** (``--libero-memory``): what a worker and each LIBERO env cost in
  proportional set size (PSS: shared pages split among the processes sharing them),
  state-only and with both cameras at 224x224, and the totals predicted for 32 envs in
  the default layout and one env per worker, against the machine's memory; 32 state-only
  envs are also built in the default layout to check the prediction
  (`measure_libero_memory`).

Run::

    python benchmarks/default_layout.py                       # ~3 minutes on 2 idle cores
    python benchmarks/default_layout.py --rounds 7 --libero   # steadier, with LIBERO
    python benchmarks/default_layout.py --quick               # seconds: does it run

Results go to ``benchmarks/results/default_layout.json`` (and the table beside it as
``.md``); `format_table` renders the table from that file.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import tyro
from gymnasium.vector import AutoresetMode

from pipelined_vec_env import PipelinedVectorEnv, default_envs_per_worker
from pipelined_vec_env.debug_envs import BusyEnv, LatencyEnv
from pipelined_vec_env.tuning.tuner import measure_layout

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # sibling benchmarks, also when loaded by path
import throughput  # noqa: E402
from _machine import run_record, write_results  # noqa: E402

__all__ = ["Args", "Workload", "format_table", "main", "run"]

if __name__ != "__main__":
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

RESULTS = HERE / "results" / "default_layout.json"
#: How a loop is timed: ``measure(env, quantity) -> env steps/s``.
Measure = Callable[[Any, int], float]


@dataclass
class Args:
    """Default layout benchmark options."""

    rounds: int = 5
    """Interleaved rounds per workload (medians are reported)."""
    halfcheetah_steps: int = 600
    """Vector steps per HalfCheetah timing."""
    latency_steps: int = 80
    """Vector steps (or the same env steps in recv/send) per latency-env timing."""
    heavy_env_steps: int = 200
    """Env steps per heavy-env timing."""
    libero: bool = False
    """Also measure LIBERO state-only (slow to build: about a minute)."""
    libero_steps: int = 40
    """Vector steps per LIBERO timing."""
    libero_memory: bool = False
    """Also measure what LIBERO envs cost in memory (`measure_libero_memory`, a few
    minutes)."""
    only: tuple[str, ...] = ()
    """Workloads to run (names as in the table; empty: all)."""
    quick: bool = False
    """Tiny numbers, one round: checks that the benchmark runs (tests)."""
    output: Path = RESULTS
    """Where to write the JSON (and the Markdown table beside it)."""


@dataclass
class Workload:
    """One workload: its envs, the layouts compared and how each is timed.

    Attributes:
        name: As in the table.
        fns: Env constructors.
        layouts: ``(name, PipelinedVectorEnv kwargs)``; the first is the default.
        measure: ``measure(env, quantity) -> env steps/s``.
        quantity: What ``measure`` is given (steps).
        target: Least ratio of the default to the reference.
        reference: ``"best"`` (the best explicit layout) or a layout name.
    """

    name: str
    fns: list[Callable[[], Any]]
    layouts: list[tuple[str, dict[str, Any]]]
    measure: Measure
    quantity: int
    target: float
    reference: str = "best"


def _timed_loop(prepare: Callable[[Any], Callable[[int], int]]) -> Measure:
    """A `Measure` of a loop made once per env by ``prepare(env)`` (kept on the env)."""
    loops: dict[int, Callable[[int], int]] = {}

    def measure(env: Any, steps: int) -> float:
        loop = loops.get(id(env))
        if loop is None:
            loop = loops[id(env)] = prepare(env)
            loop(max(4, steps // 4))  # warm-up: the workers measure and decide how to step
        start = time.perf_counter()
        done = loop(steps)
        rate = done / (time.perf_counter() - start)
        finish = getattr(loop, "finish", None)
        if finish is not None:
            finish()  # untimed: collect what is in flight
        return rate

    return measure


def _random_step_loop(env: Any) -> Callable[[int], int]:
    rng = np.random.default_rng(0)
    return throughput.prepare_vector(env, throughput._actions(env, env.num_envs, rng), 0)


def _latency_sync(env: Any) -> Callable[[int], int]:
    policy = throughput.SleepPolicy(3e-3, 0.5e-3, env.single_action_space.shape)
    state = {"obs": env.reset(seed=0)[0]}

    def loop(n: int) -> int:
        for _ in range(n):
            state["obs"] = env.step(policy(state["obs"]))[0]
        return n * env.num_envs

    return loop


def _latency_recv_send(env: Any, batch: int = 4) -> Callable[[int], int]:
    policy = throughput.SleepPolicy(3e-3, 0.5e-3, env.single_action_space.shape)
    env.async_reset(seed=0)
    drained: dict[str, Any] = {}

    def finish() -> None:
        _, _, _, _, info = env.recv(batch_size=env.num_envs)
        drained["ids"] = info["env_id"]

    def loop(n: int) -> int:
        if "ids" in drained:  # every env was received by `finish`: send them on
            ids = drained.pop("ids")
            env.send(np.zeros((len(ids), *env.single_action_space.shape), np.float32), ids)
        stepped = 0
        for _ in range(n * env.num_envs // batch):
            obs, _, _, _, info = env.recv(batch_size=batch)
            env.send(policy(obs), info["env_id"])
            stepped += len(info["env_id"])
        return stepped

    loop.finish = finish  # type: ignore[attr-defined]
    return loop


def _staged_measure(env: Any, env_steps: int) -> float:
    policy = throughput.SleepPolicy(0.0, 2e-3, env.single_action_space.shape)
    return measure_layout(env, policy, env_steps=env_steps)["steps_per_s"]


def _light_staged_measure(env: Any, env_steps: int) -> float:
    policy = throughput.SleepPolicy(0.0, 0.5e-3, env.single_action_space.shape)
    return measure_layout(env, policy, env_steps=env_steps)["steps_per_s"]


def _libero_fn(cameras: tuple[str, ...]) -> Callable[[], Any]:
    """A ``libero_spatial`` task-0 env (`libero_step._make_registered`), state-only or
    with ``cameras`` at 224x224."""
    import libero_step

    from pipelined_vec_env.libero import LIBERO_ENV_IDS

    kwargs: dict[str, Any] = {"task_id": 0, "cameras": cameras, "state_features": "full"}
    if cameras:
        kwargs["image_size"] = 224
    return functools.partial(libero_step._make_registered, LIBERO_ENV_IDS["libero_spatial"], kwargs)


def _libero_state_fn() -> Callable[[], Any]:
    return _libero_fn(())


def _libero_cameras_fn() -> Callable[[], Any]:
    return _libero_fn(("agentview", "wrist"))


def _workers_memory(fn: Callable[[], Any], num_envs: int, envs_per_worker: int) -> list[float]:
    """Each worker's PSS in MiB (psutil) with ``num_envs`` envs of ``fn``, after a reset
    and 5 random steps."""
    import psutil

    envs = PipelinedVectorEnv([fn] * num_envs, envs_per_worker=envs_per_worker)
    try:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        for _ in range(5):
            envs.step(envs.action_space.sample())
        found = []
        for proc in psutil.Process().children(recursive=True):
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if info.rss >= 256 * 1024**2:  # a worker (not the forkserver, not a tracker)
                found.append(info.pss / 1024**2)
        return found
    finally:
        envs.close()


def measure_libero_memory(num_envs: int = 32, verify: bool = True) -> dict[str, Any]:
    """What ``num_envs`` LIBERO envs (``libero_spatial`` task 0) cost in memory, state-only
    and with both cameras at 224x224: one worker of 1 env and one of 4 give a worker's
    own cost and each env's (PSS, MiB), from which the default layout's and one env per
    worker's totals for ``num_envs`` are predicted, against the machine's memory. With
    ``verify``, ``num_envs`` state-only envs are built in the default layout and their
    workers' PSS measured beside the prediction (with cameras they need more memory than
    this host has)."""
    import psutil

    machine = psutil.virtual_memory().total / 1024**2
    default = default_envs_per_worker(num_envs, 1)
    workers = -(-num_envs // default)
    kinds = {}
    for name, fn in (("state-only", _libero_state_fn()), ("cameras", _libero_cameras_fn())):
        one = sum(_workers_memory(fn, 1, 1))
        four = sum(_workers_memory(fn, 4, 4))
        per_env = (four - one) / 3
        per_worker = one - per_env
        kinds[name] = {
            "worker_of_1_mib": one,
            "worker_of_4_mib": four,
            "per_env_mib": per_env,
            "per_worker_mib": per_worker,
            "default_predicted_mib": workers * per_worker + num_envs * per_env,
            "one_per_worker_predicted_mib": num_envs * (per_worker + per_env),
        }
    if verify:
        kinds["state-only"]["default_measured_mib"] = sum(
            _workers_memory(_libero_state_fn(), num_envs, default)
        )
    return {
        "num_envs": num_envs,
        "envs_per_worker": default,
        "workers": workers,
        "machine_mib": machine,
        "kinds": kinds,
    }


def _layouts(num_envs: int, num_stages: int, explicit: list[int]) -> list[tuple[str, dict]]:
    default = default_envs_per_worker(num_envs, num_stages)
    rows: list[tuple[str, dict]] = [(f"default ({default}/worker)", {"num_stages": num_stages})]
    stage = -(-num_envs // num_stages)
    for e in sorted({min(e, stage) for e in explicit} - {default}):  # the default is its own
        rows.append((f"{e}/worker", {"num_stages": num_stages, "envs_per_worker": e}))
    return rows


def workloads(args: Args) -> list[Workload]:
    """Every workload of `Args` (quick: tiny numbers)."""
    import gymnasium as gym

    scale = 0.05 if args.quick else 1.0

    def steps(n: int) -> int:
        return max(4, int(n * scale))

    cheetah = functools.partial(gym.make, "HalfCheetah-v5")
    latency = [
        functools.partial(LatencyEnv, median_seconds=0.005, sigma=0.99, latency_seed=i)
        for i in range(8)
    ]
    heavy = [
        functools.partial(BusyEnv, step_seconds=0.004, obs_dim=137, action_dim=7) for _ in range(4)
    ]
    found = [
        Workload(
            "halfcheetah-8",
            [cheetah] * 8,
            _layouts(8, 1, [1, 2, 4, 8]),
            _timed_loop(_random_step_loop),
            steps(args.halfcheetah_steps),
            0.95,
        ),
        Workload(
            "halfcheetah-32",
            [cheetah] * 32,
            _layouts(32, 1, [4, 8, 16, 32]),
            _timed_loop(_random_step_loop),
            steps(args.halfcheetah_steps // 4),
            0.95,
        ),
        Workload(
            "latency step",
            latency,
            _layouts(8, 1, [1]),
            _timed_loop(_latency_sync),
            steps(args.latency_steps),
            0.95,
            "1/worker",
        ),
        Workload(
            "latency recv(4)/send",
            latency,
            _layouts(8, 1, [1]),
            _timed_loop(_latency_recv_send),
            steps(args.latency_steps),
            0.95,
            "1/worker",
        ),
    ]
    found.append(
        Workload(
            "halfcheetah-8 2 stages",
            [cheetah] * 8,
            _layouts(8, 2, [1, 2, 4]),
            _light_staged_measure,
            steps(args.halfcheetah_steps * 8),
            0.95,
        )
    )
    for stages in (2, 4):
        found.append(
            Workload(
                f"heavy-offcpu {stages} stages",
                heavy,
                _layouts(4, stages, [1, 4]),
                _staged_measure,
                steps(args.heavy_env_steps),
                0.95,
            )
        )
    if args.libero:
        found.append(
            Workload(
                "libero state-only",
                [_libero_state_fn()] * 4,
                _layouts(4, 1, [1]),
                _timed_loop(_random_step_loop),
                steps(args.libero_steps),
                1.0,
                "1/worker",
            )
        )
        found.append(
            Workload(
                "libero cameras",
                [_libero_cameras_fn()] * 4,
                _layouts(4, 1, [1]),
                _timed_loop(_random_step_loop),
                steps(args.libero_steps // 2),
                1.0,
                "1/worker",
            )
        )
    return [w for w in found if not args.only or w.name in args.only]


def run_workload(workload: Workload, rounds: int) -> dict[str, Any]:
    """Build every layout of ``workload``, time them in ``rounds`` interleaved rounds, and
    compare the default (the first) with its reference.

    Returns:
        ``{"workload", "target", "reference", "layouts": [{"name", "kwargs",
        "steps_per_s" (median), "samples"}], "default_profiles", "reference_name",
        "ratio" (median of the per-round ratios default / reference), "met"}``.
    """
    envs: dict[str, PipelinedVectorEnv] = {}
    samples: dict[str, list[float]] = {name: [] for name, _ in workload.layouts}
    try:
        for name, kwargs in workload.layouts:
            envs[name] = PipelinedVectorEnv(
                workload.fns, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs
            )
        for r in range(rounds):
            for name, _ in workload.layouts:
                rate = workload.measure(envs[name], workload.quantity)
                samples[name].append(rate)
                print(f"  {workload.name}: round {r + 1}/{rounds} {name:22s} {rate:9.0f} steps/s")
        default_name = workload.layouts[0][0]
        profiles = envs[default_name].step_profiles()
    finally:
        for env in envs.values():
            env.close()
    explicit = [name for name, _ in workload.layouts[1:]]
    if workload.reference == "best":  # the default among the candidates: its layout's row
        candidates = [default_name, *explicit]
        reference = max(candidates, key=lambda name: statistics.median(samples[name]))
    elif workload.reference in samples:
        reference = workload.reference
    else:  # the reference layout is the default's
        reference = default_name
    ratio = statistics.median(
        d / ref for d, ref in zip(samples[default_name], samples[reference], strict=True)
    )
    chosen = sorted({(p["stepping"], p.get("off_cpu_share")) for p in profiles}, key=str)
    return {
        "workload": workload.name,
        "target": workload.target,
        "reference": workload.reference,
        "reference_name": reference,
        "layouts": [
            {
                "name": name,
                "kwargs": kwargs,
                "steps_per_s": statistics.median(samples[name]),
                "samples": samples[name],
            }
            for name, kwargs in workload.layouts
        ],
        "default_stepping": sorted({p["stepping"] for p in profiles}),
        "default_off_cpu_share": [share for _, share in chosen if share is not None],
        "default_reasons": sorted({p["reason"] for p in profiles}),
        "ratio": ratio,
        "met": ratio >= workload.target,
    }


def run(args: Args) -> dict[str, Any]:
    """Run every workload of ``args``; the result `format_table` renders."""
    started, load_start = time.time(), throughput.os.getloadavg()[0]
    rounds = 1 if args.quick else args.rounds
    rows = [run_workload(w, rounds) for w in workloads(args)]
    memory = measure_libero_memory() if args.libero_memory else None
    return {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
        "rounds": rounds,
        "run": run_record(HERE.parent, started, load_start, ["gymnasium", "mujoco", "numpy"]),
        "rows": rows,
        "libero_memory": memory,
    }


def format_table(result: dict) -> str:
    """The results as a Markdown table: per workload the default, its reference, the
    ratio (median of per-round ratios), the target and how the default's workers step."""
    lines = [
        "| workload | default: env steps/s | stepping (off-CPU share) | reference | "
        "env steps/s | ratio | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        default = row["layouts"][0]
        ref = next(x for x in row["layouts"] if x["name"] == row["reference_name"])
        shares = "/".join(f"{s:.0%}" for s in row["default_off_cpu_share"])
        stepping = "+".join(row["default_stepping"]) + (f" ({shares})" if shares else "")
        label = "best: " if row["reference"] == "best" else ""
        met = "met" if row["met"] else "not met"
        lines.append(
            f"| {row['workload']} | {default['name']}: {default['steps_per_s']:.0f} | "
            f"{stepping} | {label}{ref['name']} | {ref['steps_per_s']:.0f} | "
            f"**{row['ratio']:.3f}x** | >= {row['target']:.2f}: {met} |"
        )
    memory = result.get("libero_memory")
    if memory:
        lines.append("")
        lines.append(memory_table(memory))
    run_ = result["run"]
    machine = run_["machine"]
    lines.append("")
    lines.append(
        f"Median of {result['rounds']} interleaved rounds; {len(machine['usable_cpus'] or [])} "
        f"usable cores ({machine['cpu_model']}), load {machine['load_average_1m_start']:.1f} "
        f"at the start, {machine['load_average_1m_end']:.1f} at the end; commit "
        f"{run_['commit']}, {run_['date']}."
    )
    return "\n".join(lines)


def memory_table(memory: dict) -> str:
    """The LIBERO memory measurement as a Markdown table (GiB)."""
    gib = 1024.0
    n, machine = memory["num_envs"], memory["machine_mib"] / gib
    lines = [
        f"| LIBERO env | a worker's own | per env | {n} envs, default "
        f"({memory['workers']} workers of {memory['envs_per_worker']}) | {n} envs, 1/worker "
        f"| machine |",
        "|---|---|---|---|---|---|",
    ]
    for name, kind in memory["kinds"].items():
        measured = kind.get("default_measured_mib")
        check = "" if measured is None else f" (measured {measured / gib:.1f})"
        lines.append(
            f"| {name} | {kind['per_worker_mib'] / gib:.2f} | {kind['per_env_mib'] / gib:.2f} | "
            f"{kind['default_predicted_mib'] / gib:.1f}{check} | "
            f"{kind['one_per_worker_predicted_mib'] / gib:.1f} | {machine:.1f} |"
        )
    return "\n".join(lines)


def main(args: Args) -> dict[str, Any]:
    result = run(args)
    write_results(args.output, result, format_table(result))
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
