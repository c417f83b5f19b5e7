"""Phase 1 of `tune`: measure the costs its layout model is fed, on one vector env with one
env per worker.

Each env's step times are taken inside its worker (wall, CPU and time runnable but waiting
for a core, from Linux's ``/proc/self/schedstat``), the message costs from no-op command
round trips and whole ``step()`` rounds on the policy's own actions, the policy's wall and
CPU time at each batch size the layouts need, and the machine's share of cores from the
probe's waits (`core_share`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import Env

from ..batching import batch_slice
from ..vector_env import PipelinedVectorEnv
from .layout_model import Costs

__all__ = ["measure_costs"]


def _noop(env: Env) -> None:
    """Called in a worker to time one command round trip."""
    return None


def _worker_cpu(env: Env) -> tuple[float, float]:
    """Called in a worker: its CPU time and its time spent runnable but waiting for a core,
    so far (seconds). The wait comes from Linux's ``/proc/self/schedstat`` (0 elsewhere)."""
    try:
        with open("/proc/self/schedstat") as f:
            on_cpu, waiting = (int(x) for x in f.read().split()[:2])
        return on_cpu * 1e-9, waiting * 1e-9
    except (OSError, ValueError):
        return time.process_time(), 0.0


def _autogroup() -> bool:
    """Whether Linux shares CPU time between sessions first (``sched_autogroup_enabled``)."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def _scheduler_slice() -> float | None:
    """Linux's time slice for nice-0 tasks (EEVDF's ``base_slice``, CFS's minimum
    granularity): 0.75 ms times ``1 + log2(cpus)``, cpus capped at 8 (the kernel's default
    logarithmic scaling); None off Linux (the model then shares cores continuously)."""
    if not sys.platform.startswith("linux"):
        return None
    cpus = min(os.cpu_count() or 1, 8)
    return 0.75e-3 * (1 + int(math.log2(cpus)))


def _check_policy_output(actions: Any, n: int, envs: PipelinedVectorEnv) -> None:
    space = envs.single_action_space
    first = actions
    while isinstance(first, dict) and first:  # a Dict action batch: its first entry
        first = next(iter(first.values()))
    try:
        ok = len(first) == n  # type: ignore[arg-type]
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(
            f"policy: expected a batch of {n} actions of {space} (first axis = the "
            f"observations given), got {type(actions).__name__} "
            f"{getattr(actions, 'shape', '')}"
        )


def _time_policy(
    policy: Callable[[Any], Any],
    envs: PipelinedVectorEnv,
    obs: Any,
    sizes: list[int],
    seconds: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Median wall and CPU seconds of one policy call at each batch size."""
    space = envs.single_observation_space
    walls, cpus = [], []
    per_size = seconds / max(1, len(sizes))
    for b in sizes:
        batch = batch_slice(space, obs, slice(0, b))
        _check_policy_output(policy(batch), b, envs)  # also a warm-up
        wall_samples, cpu_samples = [], []
        start = time.perf_counter()
        while len(wall_samples) < 3 or (
            len(wall_samples) < 50 and time.perf_counter() - start < per_size
        ):
            t0, c0 = time.perf_counter(), time.process_time()
            policy(batch)
            wall_samples.append(time.perf_counter() - t0)
            cpu_samples.append(time.process_time() - c0)
        walls.append(float(np.median(wall_samples)))
        cpus.append(float(np.median(cpu_samples)))
    return np.array(walls), np.array(cpus)


def _timed_steps(env: Env, max_steps: int, seconds: float, seed: int) -> np.ndarray:
    """Called in a worker: step its env with random actions (resetting at episode ends, as
    an autoreset would) for ``max_steps`` steps or ``seconds``, whichever comes first.

    Returns:
        float64 ``(steps, 3)``: each step's CPU time, time runnable but waiting for a core,
        and wall time (seconds).
    """
    env.action_space.seed(seed)
    rows = []
    end = time.perf_counter() + seconds
    wait = _worker_cpu(env)[1]
    while len(rows) < max_steps and (len(rows) < 2 or time.perf_counter() < end):
        action = env.action_space.sample()
        t0, c0 = time.perf_counter(), time.process_time()
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
        c1, t1 = time.process_time(), time.perf_counter()
        waited = _worker_cpu(env)[1]
        rows.append((c1 - c0, waited - wait, t1 - t0))
        wait = waited
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


def _message_costs(
    envs: PipelinedVectorEnv, policy: Callable[[Any], Any], obs: Any, probe_seconds: float
) -> tuple[float, float, np.ndarray]:
    """The round-trip latency of a no-op command to one worker (wall seconds), the caller's
    CPU per worker message (seconds, less the policy's own) and each worker's CPU per
    ``step()`` round (seconds, ``(workers,)``)."""
    n = envs.num_envs
    for _ in range(3):
        envs.call_at([0], _noop)
    trips = []
    for _ in range(20):
        t0 = time.perf_counter()
        envs.call_at([0], _noop)
        trips.append(time.perf_counter() - t0)
    latency = float(np.median(trips))
    # whole step() rounds on the policy's own actions (their dtype and layout decide the
    # path they take to the workers: an action batch that does not match the action
    # space's dtype goes pickled, costing both sides more)
    actions = policy(obs)
    _check_policy_output(actions, n, envs)
    obs, *_ = envs.step(actions)
    before = np.array(envs.call(_worker_cpu))
    c0, rounds, policy_cpu_in_rounds = time.process_time(), 0, 0.0
    t_end = time.perf_counter() + min(0.3, probe_seconds / 4)
    while rounds < 3 or (rounds < 200 and time.perf_counter() < t_end):
        p0 = time.process_time()
        actions = policy(obs)
        policy_cpu_in_rounds += time.process_time() - p0
        obs, *_ = envs.step(actions)
        rounds += 1
    caller_cpu = max(0.0, time.process_time() - c0 - policy_cpu_in_rounds)
    message_cpu = caller_cpu / rounds / (n + 1)
    in_rounds = (np.array(envs.call(_worker_cpu)) - before)[:, 0] / rounds
    return latency, message_cpu, in_rounds


def _core_share(
    cores: int,
    step_cpu: list[np.ndarray],
    step_wait: list[np.ndarray],
    step_sleep: list[np.ndarray],
    step_wall: list[np.ndarray],
) -> tuple[float, float, float]:
    """From the probe's steps (seconds, one array per env): the share of the time runnable
    the envs ran, the other processes' load (always-busy tasks) and the cores we got."""
    # other processes' load, as always-busy tasks sharing the cores: during the probe our
    # k runnable envs each ran a share `got` of the time they were runnable; equal sharing
    # gives got = cores / (k + load). Only CPU-dominated steps tell: a mostly sleeping
    # step's wait is a wake-up latency, not a share of a core.
    n = len(step_cpu)
    cpu_all, wait_all, sleep_all = (np.concatenate(x) for x in (step_cpu, step_wait, step_sleep))
    busy = cpu_all >= sleep_all
    cpu_total, wait_total = float(cpu_all[busy].sum()), float(wait_all[busy].sum())
    wall_total = float(sum(w.sum() for w in step_wall))
    got = cpu_total / (cpu_total + wait_total) if busy.mean() >= 0.1 and cpu_total > 0 else 1.0
    k_runnable = n * float((cpu_all + wait_all).sum()) / max(wall_total, 1e-9)
    background = max(0.0, cores / max(got, 1e-3) - k_runnable) if got < 0.95 else 0.0
    effective_cores = float(cores)
    if background > 0 and _autogroup():
        # Linux autogroup: CPU is shared between sessions first, so this process and its
        # workers get one session's share however many tasks they run: fewer cores, no
        # foreign tasks. The probe's envs ran at once, so their CPU rate is that share.
        span = float(np.median([w.sum() for w in step_wall]))
        effective_cores = float(np.clip(cpu_all.sum() / max(span, 1e-9), 0.05, cores))
        background = 0.0
    return got, background, effective_cores


def _stats(x: np.ndarray) -> dict[str, float]:
    return {
        "median": float(np.median(x)),
        "p90": float(np.percentile(x, 90)),
        "p99": float(np.percentile(x, 99)),
        "mean": float(x.mean()),
    }


def measure_costs(
    envs: PipelinedVectorEnv,
    policy: Callable[[Any], Any],
    sizes: list[int],
    cores: int,
    probe_steps: int,
    probe_seconds: float,
    seed: int,
    timeout: float,
) -> tuple[Costs, dict[str, Any]]:
    """Phase 1 of `tune`: measure ``envs`` (one env per worker) driven by ``policy``.

    Args:
        envs: The probe's vector env (it is reset, with ``seed``).
        policy: ``policy(obs) -> actions``, timed at each batch size of ``sizes``.
        sizes: The policy batch sizes the layouts need.
        cores: The cores the workers and the policy share.
        probe_steps: Most steps per env timed.
        probe_seconds: Time for those steps (and, half of it, for timing the policy).
        seed: Reset and random-action seed.
        timeout: Bound of the wait for the timed steps (seconds).

    Returns:
        The model's `Costs`, and the summary of them `TuneResult.measurements` keeps.

    Raises:
        ValueError: The policy does not return one action per observation.
        WaitTimeoutError: The timed steps did not finish within ``timeout``.
    """
    reset_obs, _ = envs.reset(seed=seed)
    latency, message_cpu, in_rounds = _message_costs(envs, policy, reset_obs, probe_seconds)
    # each env's steps, timed inside its worker (all at once, as the loops run them)
    envs.call_async(_timed_steps, probe_steps, probe_seconds, seed)
    timed = envs.call_wait(timeout=timeout)
    envs.reset(seed=seed)
    step_cpu = [np.maximum(t[:, 0], 0.0) for t in timed]
    step_wait = [np.maximum(t[:, 1], 0.0) for t in timed]
    step_wall = [t[:, 2] for t in timed]
    step_sleep = [
        np.maximum(w - c - q, 0.0) for w, c, q in zip(step_wall, step_cpu, step_wait, strict=True)
    ]
    worker_message_cpu = max(0.0, float(np.mean(in_rounds - [c.mean() for c in step_cpu])))
    got, background, effective_cores = _core_share(
        cores, step_cpu, step_wait, step_sleep, step_wall
    )
    policy_wall, policy_cpu = _time_policy(
        policy, envs, reset_obs, sizes, min(1.0, probe_seconds / 2)
    )
    costs = Costs(
        step_cpu=step_cpu,
        step_sleep=step_sleep,
        message_latency=max(0.0, latency - 2 * message_cpu),
        message_cpu=message_cpu,
        policy_batch_sizes=np.array(sizes),
        policy_wall=policy_wall,
        policy_cpu=policy_cpu,
        cores=effective_cores,
        background_load=background,
        worker_message_cpu=worker_message_cpu,
        caller_nice=os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else 0,
        slice_seconds=_scheduler_slice(),
    )
    work = np.concatenate([c + z for c, z in zip(step_cpu, step_sleep, strict=True)]) * 1e3
    wall = np.concatenate(step_wall) * 1e3
    summary = {
        "step_ms": {**_stats(wall), "samples": int(wall.size)},
        "step_work_ms": _stats(work),
        "cpu_fraction": float(np.concatenate(step_cpu).sum())
        / max(float(work.sum()) * 1e-3, 1e-12),
        "core_share": got,
        "background_load": background,
        "effective_cores": effective_cores,
        "message_latency_us": latency * 1e6,
        "message_cpu_us": message_cpu * 1e6,
        "worker_message_cpu_us": worker_message_cpu * 1e6,
        "policy_ms": {int(b): float(w * 1e3) for b, w in zip(sizes, policy_wall, strict=True)},
        "policy_cpu_ms": {int(b): float(c * 1e3) for b, c in zip(sizes, policy_cpu, strict=True)},
        "cores": cores,
        "slice_ms": None if costs.slice_seconds is None else costs.slice_seconds * 1e3,
    }
    return costs, summary
