"""The floor of a Python vector env over worker processes, beside `PipelinedVectorEnv`.

How fast can a few HalfCheetah envs in worker processes step on this host when the
framework around them does almost nothing? The *floor* is such a framework in a hundred
lines: each worker owns its envs and one row of a shared-memory block (actions in,
observations and rewards out, a command and an answer counter), spins for its next
command yielding its core (``sched_yield``), steps its envs (resetting one whose episode
ended), writes the results, moves its answer counter and writes one byte to a pipe, so
the caller may sleep in ``poll``. The caller either steps every worker at once (the
whole-env step: send all, hand over its core once, wait for all) or, EnvPool-style, takes
the workers that answered until it holds ``num_envs // 2`` envs (``recv``) and sends those
envs their next actions (``send``). It checks nothing, returns no infos, terminations or
truncations, survives no crash and bounds no wait: it prices the design's moving parts
(processes, shared memory, spins, one pipe byte an answer), not a usable vector env.

``PipelinedVectorEnv`` runs the same two loops on the same envs and layout in the same
rounds (`cpu_per_step.measure`; each variant built afresh, the four in turn every round),
so the gap between the two is what its checks, protocol and bookkeeping cost here. With
``--work-us`` the floor also runs with stand-in work (busy waiting) in the caller before
and after its sends and in the workers before they answer: how fast the floor would go
with a framework's per-call costs, placed where they fall.

Run::

    python benchmarks/python_floor.py                  # 8 envs, 2 workers of 4, 3 rounds
    python benchmarks/python_floor.py --rounds 5 --env null
    python benchmarks/python_floor.py --no-ours --work-us 40:10:0 0:0:50 40:10:50
"""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import run_record, workers_cpu_seconds, write_results  # noqa: E402

__all__ = ["Args", "main", "measure_floor", "measure_ours"]

REPO = Path(__file__).resolve().parents[1]
OBS, ACT = 17, 6  # HalfCheetah-v5's observation and action sizes
COMMAND, ANSWER = 0, 1  # a worker row's counters (int64 cells at its start)
HEADER = 2


@dataclass
class Args:
    """Floor benchmark options."""

    env: Literal["cheetah", "null"] = "cheetah"
    """``cheetah``: HalfCheetah-v5; ``null``: a step that returns zeros (the framework alone)."""
    num_envs: int = 8
    """Envs in all."""
    envs_per_worker: int = 4
    """Envs per worker process, the same for the floor and ours (4 is ours' default for 8
    envs on 2 cores)."""
    steps: int = 3000
    """Vector steps' worth of env steps timed per variant and round."""
    warmup: int = 100
    """Vector steps' worth run before timing."""
    rounds: int = 3
    """Rounds; every round builds and times each variant once, in turn."""
    work_us: tuple[str, ...] = ()
    """Floor variants with stand-in work, each ``BEFORE:AFTER:WORKER`` microseconds of busy
    waiting: the caller's per call before its send and after it, each worker's per step
    before it answers (what a framework's checks and bookkeeping would take there); each
    adds a ``floor+BEFORE:AFTER:WORKER`` row per loop."""
    ours: bool = True
    """Time ``PipelinedVectorEnv`` beside the floor (``--no-ours``: the floor rows alone)."""
    output: Path = REPO / "benchmarks" / "results" / "python_floor.json"
    """The JSON results; the markdown table goes beside it (.md)."""


def _make_env(kind: str) -> Any:
    if kind == "null":
        return None
    env = gym.make("HalfCheetah-v5")
    env.reset(seed=0)
    return env


def _row_views(block: np.ndarray, k: int, per: int) -> tuple[np.ndarray, ...]:
    """Worker ``k``'s counters (int64), actions, observations and rewards in ``block``."""
    row = block[k]
    counters = row[:HEADER].view(np.int64)
    actions = row[HEADER : HEADER + per * ACT].reshape(per, ACT)
    obs = row[HEADER + per * ACT : HEADER + per * (ACT + OBS)].reshape(per, OBS)
    rewards = row[HEADER + per * (ACT + OBS) :]
    return counters, actions, obs, rewards


def _busy(us: float) -> None:
    """Spin for ``us`` microseconds (stand-in work)."""
    if us > 0:
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass


def _floor_worker(
    k: int, name: str, shape: tuple[int, int], per: int, fd: int, kind: str, work_us: float
) -> None:
    """Serve worker ``k``'s commands until the command counter goes negative, spending
    ``work_us`` of stand-in work per step before answering."""
    memory = shared_memory.SharedMemory(name=name)
    block = np.ndarray(shape, dtype=np.float64, buffer=memory.buf)
    counters, actions, obs, rewards = _row_views(block, k, per)
    envs = [_make_env(kind) for _ in range(per)]
    seen = 0
    while True:
        while counters[COMMAND] == seen:
            os.sched_yield()
        seen = int(counters[COMMAND])
        if seen < 0:
            break
        batch = actions.copy()
        for i, env in enumerate(envs):
            if env is None:
                obs[i], rewards[i] = 0.0, 0.0
                continue
            o, r, terminated, truncated, _ = env.step(batch[i])
            if terminated or truncated:
                o, _ = env.reset()
            obs[i], rewards[i] = o, r
        _busy(work_us)
        counters[ANSWER] = seen
        os.write(fd, b"x")
    del counters, actions, obs, rewards, block
    memory.close()


def _timed(
    run: Callable[[int], tuple[int, int]], args: Args, pids: Sequence[int]
) -> dict[str, float]:
    """Warm up, then time ``run`` (returns env steps and calls) on the caller's and the
    workers' CPU clocks."""
    run(args.warmup)
    workers, cpu, wall = workers_cpu_seconds(pids), time.process_time(), time.perf_counter()
    env_steps, calls = run(args.steps)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    workers = workers_cpu_seconds(pids) - workers
    return {
        "env_steps_per_s": env_steps / wall,
        "caller_cpu_us": cpu / env_steps * 1e6,
        "workers_cpu_us": workers / env_steps * 1e6,
        "envs_per_call": env_steps / calls,
    }


def measure_floor(
    loop: str, args: Args, work: tuple[float, float, float] = (0.0, 0.0, 0.0)
) -> dict[str, float]:
    """Time the floor's ``loop`` (``step`` or ``sendrecv``) once, with ``work`` (before
    send, after send, worker: microseconds; see `Args.work_us`)."""
    before, after, worker_us = work
    n, per = args.num_envs, args.envs_per_worker
    workers = n // per
    shape = (workers, HEADER + per * (ACT + OBS + 1))
    memory = shared_memory.SharedMemory(create=True, size=int(np.prod(shape)) * 8)
    block = np.ndarray(shape, dtype=np.float64, buffer=memory.buf)
    block[:] = 0.0
    rows = [_row_views(block, k, per) for k in range(workers)]
    pipes = [os.pipe() for _ in range(workers)]
    context = mp.get_context("fork")  # the worker is a function of this script
    procs = [
        context.Process(
            target=_floor_worker,
            args=(k, memory.name, shape, per, pipes[k][1], args.env, worker_us),
            daemon=True,
        )
        for k in range(workers)
    ]
    for p in procs:
        p.start()
    poller = select.poll()
    for read_fd, _ in pipes:
        poller.register(read_fd, select.POLLIN)
    actions = np.random.default_rng(0).uniform(-1, 1, (64, n, ACT))
    sent = [0] * workers

    def send(k: int, batch: np.ndarray) -> None:
        counters, slot, _, _ = rows[k]
        slot[:] = batch
        sent[k] += 1
        counters[COMMAND] = sent[k]

    def answered(k: int) -> bool:
        return bool(rows[k][0][ANSWER] == sent[k])

    def take(k: int) -> tuple[np.ndarray, np.ndarray]:
        os.read(pipes[k][0], 1)
        _, _, obs, rewards = rows[k]
        return obs.copy(), rewards.copy()

    def step(count: int) -> tuple[int, int]:
        for i in range(count):
            batch = actions[i % 64]
            _busy(before)
            for k in range(workers):
                send(k, batch[k * per : (k + 1) * per])
            _busy(after)
            os.sched_yield()  # a worker sharing this core starts now
            results: list[Any] = [None] * workers
            while any(r is None for r in results):
                for k in range(workers):
                    if results[k] is None and answered(k):
                        results[k] = take(k)
                if any(r is None for r in results):
                    poller.poll()
            np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])
        return count * n, count

    in_flight = [False] * workers

    def send_recv(count: int) -> tuple[int, int]:
        received = calls = 0
        while received < count * n:
            ready = [k for k in range(workers) if in_flight[k] and answered(k)]
            while len(ready) * per < n // 2:
                poller.poll()
                ready = [k for k in range(workers) if in_flight[k] and answered(k)]
            results = [take(k) for k in ready]
            np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])
            batch = actions[calls % 64]
            _busy(before)
            for k in ready:
                send(k, batch[k * per : (k + 1) * per])
            _busy(after)
            received += len(ready) * per
            calls += 1
        return received, calls

    try:
        if loop == "sendrecv":
            for k in range(workers):
                send(k, actions[0][k * per : (k + 1) * per])
                in_flight[k] = True
        return _timed(step if loop == "step" else send_recv, args, [p.pid for p in procs])
    finally:
        for counters, *_ in rows:
            counters[COMMAND] = -1
        for p in procs:
            p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
        for read_fd, write_fd in pipes:
            os.close(read_fd)
            os.close(write_fd)
        rows.clear()  # the views go before the block's memory is unmapped
        del block
        memory.close()
        memory.unlink()


def measure_ours(loop: str, args: Args) -> dict[str, float]:
    """Time ``PipelinedVectorEnv``'s ``loop`` (``step`` or ``sendrecv``) once, through
    `cpu_per_step.measure` (its null env also returns two float infos)."""
    from cpu_per_step import measure

    case = f"{args.env}-1x{args.envs_per_worker}-{loop}"
    result = measure(case, args.steps, args.warmup, args.num_envs)
    return {
        "env_steps_per_s": 1e6 / result["wall_us"],
        "caller_cpu_us": result["parent_us"],
        "workers_cpu_us": result["workers_us"],
        "envs_per_call": result["envs_per_call"],
    }


LOOPS = ("step", "sendrecv")


def _stand_ins(specs: Sequence[str]) -> list[tuple[str, tuple[float, float, float]]]:
    """``(row label, (before, after, worker))`` for each ``BEFORE:AFTER:WORKER`` spec.

    Raises:
        ValueError: A spec that is not three non-negative numbers joined by colons.
    """
    out = []
    for spec in specs:
        try:
            before, after, worker = (float(x) for x in spec.split(":"))
        except ValueError:
            raise ValueError(
                f"work_us: expected BEFORE:AFTER:WORKER microseconds, got {spec!r}"
            ) from None
        if min(before, after, worker) < 0:
            raise ValueError(f"work_us: expected non-negative microseconds, got {spec!r}")
        out.append((f"+{spec}", (before, after, worker)))
    return out


def format_table(summary: dict[str, dict[str, float]]) -> str:
    """The medians as a markdown table, with each loop's rate beside the floor's."""
    lines = [
        "| variant | loop | env steps/s | vs the floor's same loop | caller CPU us/env step"
        " | workers' CPU us/env step | env steps per call |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, row in summary.items():
        who, loop = key.split(" ")
        floor = summary[f"floor {loop}"]["env_steps_per_s"]
        lines.append(
            f"| {who} | {loop} | {row['env_steps_per_s']:.0f} |"
            f" {row['env_steps_per_s'] / floor:.2f}x | {row['caller_cpu_us']:.1f} |"
            f" {row['workers_cpu_us']:.1f} | {row['envs_per_call']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every variant ``rounds`` times in turn; print and write the medians."""
    args = tyro.cli(Args, args=argv)
    if args.num_envs % args.envs_per_worker or args.num_envs < 2 * args.envs_per_worker:
        raise ValueError(
            f"num_envs: expected a multiple of envs_per_worker={args.envs_per_worker} with "
            f"at least 2 workers, got {args.num_envs}"
        )
    variants: list[tuple[str, str, Callable[[], dict[str, float]]]] = [
        (f"floor{label}", loop, partial(measure_floor, loop, args, work))
        for label, work in [("", (0.0, 0.0, 0.0)), *_stand_ins(args.work_us)]
        for loop in ("step", "sendrecv")
    ]
    if args.ours:
        variants += [("ours", loop, partial(measure_ours, loop, args)) for loop in LOOPS]
    started, load_start = time.time(), os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for who, loop, measure in variants:
            result = measure()
            runs.setdefault(f"{who} {loop}", []).append(result)
            print(
                f"round {r + 1}/{args.rounds}  {who:5s} {loop:8s} "
                f"{result['env_steps_per_s']:8.0f} env steps/s",
                flush=True,
            )
    summary = {
        key: {k: statistics.median(run[k] for run in results) for k in results[0]}
        for key, results in runs.items()
    }
    text = (
        f"{args.env}, {args.num_envs} envs in workers of {args.envs_per_worker}, medians of "
        f"{args.rounds} rounds\n\n" + format_table(summary)
    )
    report = {
        **run_record(REPO, started, load_start, ("gymnasium", "mujoco", "numpy")),
        "args": {k: str(v) for k, v in asdict(args).items()},
        "summary": summary,
        "runs": runs,
    }
    write_results(args.output, report, text)
    return report


if __name__ == "__main__":
    main()
