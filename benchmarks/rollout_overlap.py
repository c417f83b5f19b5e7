"""Serial vs pipelined rollouts of the reference trainer, side by side, with the ideal bound.

The env is ``pipelined_vec_env.debug_envs.BusyEnv``: each step burns a fixed CPU time in
its worker (default 10 ms, LIBERO's state-only step time on one core), observation 137
floats (libero_object's padded state), 7-dim actions. The policy is the trainer's
``ActorCritic`` and the loop is the trainer's ``RolloutCollector``, exactly as in training.

Measured, per configuration, the wall time of one *round* (one decision in every env):

* ``Te``: envs alone (``step`` of all envs with fixed actions, no inference);
* ``Ti``: inference alone (the policy on all ``N`` observations, no envs);
* serial loop; pipelined loop with 1, 2 and 4 stages (1 stage is the control: nothing
  to overlap with).

The design notes' bound for a pipeline is ``max(Te, Ti) / (Te + Ti)`` of the serial time
(``Te + Ti``). On a CPU-only machine the policy and the simulators share cores, so the
bound is optimistic there; with the policy on a GPU it is the real ceiling.

On a CPU-only machine the policy and the simulators share cores: unless the simulators
yield, the policy's inference (the pipeline's critical path) is time-sliced with every
busy worker and the pipeline loses. The env workers therefore run at nice 10 by default
(``--worker-nice 0`` to compare; ``PipelinedVectorEnv(worker_nice=...)``).

``--workload offcpu`` is the overlap workload instead: a CPU-bound env of 4 ms per
step (``BusyEnv``), a policy that sleeps 2 ms per observation (off the CPU, as a GPU
would), 4 envs, one worker per stage, 1/2/4 stages, on the machine's cores; the loop is
`pipelined_vec_env.tuning.tuner.measure_layout`'s staged round robin (``step_wait(stage=s)``,
policy, ``step_async``). Each measurement is printed beside the ideal rate

    N / max(N * B, k * Te + k * B, N * Te / min(cores, stages))

(``k`` envs per stage, ``B`` policy seconds per observation, ``Te`` seconds per step),
for each lever (``--levers``): the workers' nice value, the caller's priority, pinning the
workers to cores. Points are interleaved over ``--repeats`` rounds, each the same number
of env steps; the median is reported.

Usage::

    python benchmarks/rollout_overlap.py                     # CPU, writes results JSON
    python benchmarks/rollout_overlap.py --device cuda --hidden-sizes 2048 2048 2048
    python benchmarks/rollout_overlap.py --workload offcpu   # results/rollout_overlap_offcpu.*
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import tyro
from gymnasium.vector import AutoresetMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, machine_identity, relative_paths  # noqa: E402

from pipelined_vec_env import PipelinedVectorEnv  # noqa: E402
from pipelined_vec_env.debug_envs import BusyEnv  # noqa: E402
from pipelined_vec_env.tuning.tuner import measure_layout  # noqa: E402
from reference_trainer.agent import ActorCritic, obs_to_tensor  # noqa: E402
from reference_trainer.metrics import ideal_pipelined_fraction  # noqa: E402
from reference_trainer.rollout import RolloutCollector  # noqa: E402

# loaded by path (tests): workers cannot import this module by name
if __name__ != "__main__":
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclass
class Args:
    """Rollout overlap benchmark."""

    workload: Literal["trainer", "offcpu"] = "trainer"
    """``trainer``: the trainer's collector and ActorCritic on a 10 ms env; ``offcpu``:
    the overlap workload (4 ms CPU-bound env, policy sleeping 2 ms per observation, 4 envs)
    with the ideal bound beside each measurement, per lever."""
    num_envs: int | None = None
    """Envs (one per worker); default 8 (trainer) or 4 (offcpu)."""
    step_ms: float | None = None
    """CPU time per env step in milliseconds; default 10 (trainer, LIBERO state-only) or 4
    (offcpu)."""
    policy_ms_per_obs: float = 2.0
    """offcpu: the policy's sleep per observation, in milliseconds."""
    levers: tuple[str, ...] = (
        "inherit",
        "nice10",
        "nice19",
        "caller-10",
        "nice19+caller-10",
        "nice19+pin",
        "nice19+fifo",
        "idle",
    )
    """offcpu: configurations to compare, ``+``-joined tokens: ``inherit`` (nothing set),
    ``nice<N>`` (``worker_nice=N``), ``caller<N>`` (the caller's nice value during the
    measurement), ``pin`` (``cpu_affinity="auto"``), ``fifo`` (the caller in
    ``SCHED_FIFO``, priority 1, during the measurement), ``idle`` (workers in
    ``SCHED_IDLE``, set from the caller on their pids)."""
    env_steps: int = 600
    """offcpu: env steps per measurement (the same for every point)."""
    obs_dim: int = 137
    """Observation size (libero_object's padded state)."""
    stages: tuple[int, ...] = (1, 2, 4)
    """Stage counts for the pipelined loop."""
    hidden_sizes: tuple[int, ...] = (2048, 2048, 2048)
    """Policy MLP hidden sizes (sets the inference time)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Policy device."""
    torch_threads: int = 1
    """Torch CPU threads in the trainer process."""
    worker_nice: int = 10
    """trainer: nice value of the env workers: 10 lets the trainer's inference preempt
    the simulators (on a CPU-only machine they share cores); 0 leaves priorities alone."""
    num_steps: int = 24
    """Decisions per env per measured rollout."""
    repeats: int = 5
    """Measured rollouts per configuration (the median is reported)."""
    output: str | None = None
    """JSON output path (default benchmarks/results/rollout_overlap_<device>.json, or
    rollout_overlap_offcpu.json with a Markdown table beside it)."""


def _make_env(step_seconds: float, obs_dim: int) -> BusyEnv:
    return BusyEnv(step_seconds=step_seconds, obs_dim=obs_dim, action_dim=7, episode_length=10_000)


def _envs(args: Args, num_stages: int) -> PipelinedVectorEnv:
    fn = functools.partial(_make_env, args.step_ms / 1000.0, args.obs_dim)
    return PipelinedVectorEnv(
        [fn] * args.num_envs,
        num_stages=num_stages,
        autoreset_mode=AutoresetMode.SAME_STEP,
        worker_nice=args.worker_nice or None,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time_env_round(envs: PipelinedVectorEnv, args: Args) -> float:
    actions = np.zeros((args.num_envs, 7), dtype=np.float32)
    envs.reset(seed=0)
    envs.step(actions)
    samples = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.num_steps):
            envs.step(actions)
        samples.append((time.perf_counter() - t0) / args.num_steps)
    return statistics.median(samples)


def _time_inference_round(agent: ActorCritic, args: Args, device: torch.device) -> float:
    obs = np.random.default_rng(0).standard_normal((args.num_envs, args.obs_dim)).astype(np.float32)
    noise = torch.zeros((args.num_envs, 7), device=device)
    samples = []
    with torch.no_grad():
        for _ in range(args.repeats + 1):
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(args.num_steps):
                out = agent.act(obs_to_tensor(obs, device), noise)
                out.action.cpu().numpy()
            samples.append((time.perf_counter() - t0) / args.num_steps)
    return statistics.median(samples[1:])


class _Config:
    """One loop configuration with its own vector env and collector."""

    def __init__(
        self, args: Args, agent: ActorCritic, device: torch.device, loop: str, stages: int
    ):
        self.loop, self.stages = loop, stages
        self.envs = _envs(args, stages)
        self.collector = RolloutCollector(
            self.envs, agent, args.num_steps, device, pipelined=(loop == "pipelined")
        )
        self.collector.reset(seed=0)
        self.collector.collect()  # warm-up
        self.rounds: list[float] = []
        self.bubbles: list[float] = []
        self.waits: list[float] = []
        self.infers: list[float] = []

    def measure(self, num_steps: int) -> None:
        timings = self.collector.collect().timings
        self.rounds.append(timings.rollout_s / num_steps)
        self.bubbles.append(timings.bubble_fraction)
        self.waits.append((timings.env_wait_s + timings.env_send_s) / num_steps)
        self.infers.append(timings.inference_s / num_steps)

    def row(self, num_envs: int) -> dict:
        round_s = statistics.median(self.rounds)
        return {
            "loop": self.loop,
            "stages": self.stages,
            "round_s": round_s,
            "round_s_samples": self.rounds,
            "bubble_fraction": statistics.median(self.bubbles),
            "env_per_round_s": statistics.median(self.waits),
            "inference_per_round_s": statistics.median(self.infers),
            "env_steps_per_s": num_envs / round_s,
        }


def _machine(device: torch.device) -> dict:
    return {
        **machine_identity(),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(0)
        if device.type == "cuda"
        else platform.processor(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "sched_autogroup": _read("/proc/sys/kernel/sched_autogroup_enabled"),
    }


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def run(args: Args) -> dict:
    """Run every configuration and return the results (also printed as a table).

    Configurations are measured interleaved (serial, 1, 2, 4 stages, serial, ...) so that
    a change in the machine's load during the run affects all of them alike.
    """
    args = dataclasses.replace(
        args, num_envs=args.num_envs or 8, step_ms=args.step_ms if args.step_ms else 10.0
    )
    torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device)
    probe = _make_env(0.0, args.obs_dim)
    torch.manual_seed(0)
    agent = ActorCritic(probe.observation_space, probe.action_space, args.hidden_sizes).to(device)
    agent.eval()

    configs: list[_Config] = []
    try:
        configs.append(_Config(args, agent, device, "serial", 1))
        te = _time_env_round(configs[0].envs, args)
        ti = _time_inference_round(agent, args, device)
        for num_stages in args.stages:
            configs.append(_Config(args, agent, device, "pipelined", num_stages))
        for _ in range(args.repeats):
            for config in configs:
                config.measure(args.num_steps)
    finally:
        for config in configs:
            config.envs.close()
    rows = [config.row(args.num_envs) for config in configs]
    serial_round = rows[0]["round_s"]
    for row in rows:
        row["speedup_vs_serial"] = serial_round / row["round_s"]
    ideal = ideal_pipelined_fraction(te, ti)
    return {
        "args": dataclasses.asdict(args),
        "machine": _machine(device),
        "env_round_s": te,
        "inference_round_s": ti,
        "ideal_pipelined_fraction": ideal,
        "ideal_speedup": 1.0 / ideal,
        "rows": rows,
    }


def _print_table(result: dict) -> None:
    te, ti = result["env_round_s"], result["inference_round_s"]
    print(f"Te (envs alone) {te * 1e3:.2f} ms/round, Ti (inference alone) {ti * 1e3:.2f} ms/round")
    print(
        f"ideal pipelined/serial time max(Te,Ti)/(Te+Ti) = {result['ideal_pipelined_fraction']:.3f}"
        f" -> best speed-up {result['ideal_speedup']:.2f}x"
    )
    print(
        f"{'loop':<10} {'stages':>6} {'ms/round':>9} {'steps/s':>9} {'speed-up':>9} {'bubble':>7}"
    )
    for row in result["rows"]:
        print(
            f"{row['loop']:<10} {row['stages']:>6} {row['round_s'] * 1e3:>9.2f} "
            f"{row['env_steps_per_s']:>9.1f} {row['speedup_vs_serial']:>8.2f}x "
            f"{row['bubble_fraction']:>7.2f}"
        )


# --------------------------------------------------------------------------- offcpu


def ideal_rate(
    num_envs: int, num_stages: int, step_s: float, per_obs_s: float, cores: int
) -> float:
    """The overlap bound for one worker per stage: env steps/s.

    ``N / max(N * B, k * Te + k * B, N * Te / min(cores, stages))``: the policy's time per
    round, one stage's cycle (its ``k`` envs stepped in turn, then its inference), the
    cores. ``k`` is the largest stage (``np.array_split``).
    """
    k = -(-num_envs // num_stages)
    return num_envs / max(
        num_envs * per_obs_s,
        k * step_s + k * per_obs_s,
        num_envs * step_s / min(cores, num_stages),
    )


class _SleepPolicy:
    """Off-CPU policy: sleeps ``per_obs_s`` per observation, returns zero actions."""

    def __init__(self, per_obs_s: float, action_dim: int) -> None:
        self.per_obs_s, self.action_dim = per_obs_s, action_dim

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        time.sleep(self.per_obs_s * len(obs))
        return np.zeros((len(obs), self.action_dim), dtype=np.float32)


def _pid(env: object) -> int:
    return os.getpid()


def _schedstat(env: object = None) -> tuple[float, float]:
    """This process's (main thread's) CPU time and time runnable but waiting for a core,
    in seconds, from Linux's ``/proc/self/schedstat`` ((0, 0) elsewhere)."""
    try:
        with open("/proc/self/schedstat") as f:
            on_cpu, waiting = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return 0.0, 0.0
    return on_cpu * 1e-9, waiting * 1e-9


class _ByValue:
    """A function that travels to the workers by value (call payloads go by plain pickle,
    which would name this script's module, unknown to a worker)."""

    def __init__(self, fn: object) -> None:
        self.fn = fn

    def __call__(self, *args: object) -> object:
        return self.fn(*args)

    def __reduce__(self) -> tuple:
        import cloudpickle

        return cloudpickle.loads, (cloudpickle.dumps(self.fn),)


def _worker_firsts(envs: PipelinedVectorEnv) -> list[int]:
    """One env index per worker (one worker per stage here)."""
    return [sl.start for sl in envs.stage_slices]


@dataclass
class _Lever:
    """One configuration of priorities and placement (see ``Args.levers``)."""

    name: str
    worker_nice: int | None = None
    caller_nice: int | None = None
    pin: bool = False
    fifo: bool = False
    idle: bool = False

    @classmethod
    def parse(cls, name: str) -> _Lever:
        lever = cls(name)
        for token in name.split("+"):
            if token == "inherit":
                continue
            if token == "pin":
                lever.pin = True
            elif token == "fifo":
                lever.fifo = True
            elif token == "idle":
                lever.idle = True
            elif token.startswith("nice"):
                lever.worker_nice = int(token[4:])
            elif token.startswith("caller"):
                lever.caller_nice = int(token[6:])
            else:
                raise ValueError(f"levers: unknown token {token!r} in {name!r}")
        return lever


class _CallerPriority:
    """Context manager: the caller's nice value / SCHED_FIFO for one measurement."""

    def __init__(self, lever: _Lever) -> None:
        self.lever = lever
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)
        self.policy = os.sched_getscheduler(0)
        self.param = os.sched_getparam(0)

    def __enter__(self) -> None:
        if self.lever.caller_nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, self.lever.caller_nice)
        if self.lever.fifo:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))

    def __exit__(self, *exc: object) -> None:
        if self.lever.fifo:
            os.sched_setscheduler(0, self.policy, self.param)
        os.setpriority(os.PRIO_PROCESS, 0, self.nice)


def _offcpu_envs(args: Args, lever: _Lever, num_stages: int) -> PipelinedVectorEnv:
    fn = functools.partial(_make_env, args.step_ms / 1000.0, args.obs_dim)
    envs = PipelinedVectorEnv(
        [fn] * args.num_envs,
        num_stages=num_stages,
        envs_per_worker=args.num_envs,  # one worker per stage
        autoreset_mode=AutoresetMode.SAME_STEP,
        worker_nice=lever.worker_nice,
        cpu_affinity="auto" if lever.pin else None,
    )
    if lever.idle:
        for pid in set(envs.call_at(range(args.num_envs), _ByValue(_pid))):
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    return envs


def run_offcpu(args: Args) -> dict:
    """Measure the overlap workload per lever and stage count, interleaved.

    Returns:
        The results: arguments, machine and load, and one row per (lever, stages) with
        the median env steps/s, every sample, the ideal rate and their ratio.
    """
    args = dataclasses.replace(
        args, num_envs=args.num_envs or 4, step_ms=args.step_ms if args.step_ms else 4.0
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    levers = [_Lever.parse(name) for name in args.levers]
    policy = _SleepPolicy(args.policy_ms_per_obs / 1000.0, 7)
    machine_start = _machine(torch.device("cpu"))
    points: list[tuple[_Lever, int, PipelinedVectorEnv]] = []
    samples: dict[tuple[str, int], list[float]] = {}
    waits: dict[tuple[str, int], list[tuple[float, float]]] = {}
    skipped: dict[str, str] = {}
    started = time.perf_counter()
    try:
        for lever in levers:
            for num_stages in args.stages:
                points.append((lever, num_stages, _offcpu_envs(args, lever, num_stages)))
        for _ in range(args.repeats):
            for lever, num_stages, envs in points:
                if lever.name in skipped:
                    continue
                firsts = _worker_firsts(envs)
                caller0, workers0 = _schedstat(), envs.call_at(firsts, _ByValue(_schedstat))
                try:
                    with _CallerPriority(lever):
                        stats = measure_layout(envs, policy, env_steps=args.env_steps)
                except PermissionError as exc:
                    skipped[lever.name] = f"{type(exc).__name__}: {exc}"
                    continue
                caller1, workers1 = _schedstat(), envs.call_at(firsts, _ByValue(_schedstat))
                key = (lever.name, num_stages)
                samples.setdefault(key, []).append(stats["steps_per_s"])
                # waiting for a core, per env step: the caller's, and the workers' summed
                waits.setdefault(key, []).append(
                    (
                        (caller1[1] - caller0[1]) / stats["steps"],
                        sum(b[1] - a[1] for a, b in zip(workers0, workers1, strict=True))
                        / stats["steps"],
                    )
                )
    finally:
        for *_, envs in points:
            envs.close()
    rows = []
    for lever in levers:
        for num_stages in args.stages:
            got = samples.get((lever.name, num_stages))
            if not got:
                continue
            ideal = ideal_rate(
                args.num_envs, num_stages, args.step_ms / 1e3, args.policy_ms_per_obs / 1e3, cores
            )
            rate = statistics.median(got)
            rows.append(
                {
                    "lever": lever.name,
                    "stages": num_stages,
                    "envs_per_stage": -(-args.num_envs // num_stages),
                    "steps_per_s": rate,
                    "samples": got,
                    "caller_wait_ms_per_step": statistics.median(
                        w[0] * 1e3 for w in waits[(lever.name, num_stages)]
                    ),
                    "workers_wait_ms_per_step": statistics.median(
                        w[1] * 1e3 for w in waits[(lever.name, num_stages)]
                    ),
                    "ideal_steps_per_s": ideal,
                    "of_ideal": rate / ideal,
                }
            )
    return {
        "workload": "offcpu",
        "args": dataclasses.asdict(args),
        "cores": cores,
        "machine": machine_start,
        "loadavg_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "seconds": time.perf_counter() - started,
        "skipped_levers": skipped,
        "targets": {"2": 0.9, "4": 0.8},
        "rows": rows,
    }


def _offcpu_tables(result: dict) -> list[str]:
    parts = offcpu_table(result).split("\n\n")
    return [part for part in parts if part.startswith("|")]


def offcpu_rates_table(result: dict) -> str:
    """The first table of ``offcpu_table``: env steps/s (fraction of ideal) per lever."""
    return _offcpu_tables(result)[0]


def offcpu_waits_table(result: dict) -> str:
    """The second table of ``offcpu_table``: ms per env step waiting for a core."""
    return _offcpu_tables(result)[1]


def offcpu_table(result: dict) -> str:
    """The offcpu results as a Markdown table (levers as rows, stage counts as columns)."""
    args = result["args"]
    stages = list(args["stages"])
    lines = [
        f"{args['num_envs']} envs, {args['step_ms']:g} ms CPU per step, policy sleeps "
        f"{args['policy_ms_per_obs']:g} ms per observation, one worker per stage, "
        f"{result['cores']} cores; {args['env_steps']} env steps per point, median of "
        f"{args['repeats']} interleaved rounds. Load average {result['machine']['loadavg']} "
        f"at start, {result['loadavg_end']} at end.",
        "",
        "| lever | " + " | ".join(f"{s} stage{'s' if s > 1 else ''}" for s in stages) + " |",
        "|---|" + "---:|" * len(stages),
    ]
    by = {(r["lever"], r["stages"]): r for r in result["rows"]}
    ideal_cells = []
    for s in stages:
        row = next((r for r in result["rows"] if r["stages"] == s), None)
        ideal_cells.append(f"{row['ideal_steps_per_s']:.0f}" if row else "-")
    lines.append("| ideal steps/s | " + " | ".join(ideal_cells) + " |")
    for lever in args["levers"]:
        cells = []
        for s in stages:
            r = by.get((lever, s))
            cells.append(f"{r['steps_per_s']:.0f} ({r['of_ideal']:.2f})" if r else "-")
        if any(c != "-" for c in cells):
            lines.append(f"| {lever} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Waiting for a core (runnable, not running; Linux schedstat), ms per env step, "
        "caller / workers (all workers summed); 4 ms of CPU per step is the env's work:",
        "",
        "| lever | " + " | ".join(f"{s} stage{'s' if s > 1 else ''}" for s in stages) + " |",
        "|---|" + "---:|" * len(stages),
    ]
    for lever in args["levers"]:
        cells = []
        for s in stages:
            r = by.get((lever, s))
            cells.append(
                f"{r['caller_wait_ms_per_step']:.2f} / {r['workers_wait_ms_per_step']:.2f}"
                if r and "caller_wait_ms_per_step" in r
                else "-"
            )
        if any(c != "-" for c in cells):
            lines.append(f"| {lever} | " + " | ".join(cells) + " |")
    for lever, why in result["skipped_levers"].items():
        lines.append(f"\n{lever}: not measured ({why})")
    lines.append("")
    for s, target in ((2, 0.9), (4, 0.8)):
        got = [(r["of_ideal"], r["lever"]) for r in result["rows"] if r["stages"] == s]
        if got:
            best, name = max(got)
            status = "met" if best >= target else "NOT met"
            lines.append(
                f"- {s} stages: best {best:.2f} of ideal ({name}), target >= {target}: {status}"
            )
    return "\n".join(lines)


def main() -> None:
    """CLI entry point."""
    args = tyro.cli(Args)
    if args.workload == "offcpu":
        result = run_offcpu(args)
        table = offcpu_table(result)
        print(table)
        out = Path(args.output or Path(__file__).parent / "results" / "rollout_overlap_offcpu.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(relative_paths(result), indent=2))
        out.with_suffix(".md").write_text(table + "\n")
        print(f"wrote {out} and {out.with_suffix('.md')}")
        return
    result = run(args)
    _print_table(result)
    out = Path(
        args.output or Path(__file__).parent / "results" / f"rollout_overlap_{args.device}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(relative_paths(result), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
