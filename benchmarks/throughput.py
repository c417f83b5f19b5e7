"""Env-step throughput of PipelinedVectorEnv next to gymnasium, SB3 and EnvPool.

Every backend steps the same env (``HalfCheetah-v5`` by default, 8 envs) with the same
pre-drawn random actions, in one run, so the ratios printed are side by side. Every
backend is built once, then timed in rounds; each round visits every backend in turn
(warm up, time), so slow drift on a shared machine spreads over all of them instead of
favouring whichever ran first. The table shows the median over rounds, and ratios to
Sync/Async are medians of per-round paired ratios. CPU time per env step (this process
with its threads, plus the worker processes) is reported next to wall-clock throughput:
on a loaded machine it is the steadier figure.

Two figures:

- **Throughput** (env steps per second of wall time): gymnasium ``SyncVectorEnv`` and
  ``AsyncVectorEnv`` (shared memory), SB3 ``SubprocVecEnv``, EnvPool if importable (sync
  ``step`` and async ``send``/``recv``), ours in several ``(num_stages, envs_per_worker)``
  configs with whole-env ``step``, ours with a staged loop (``step_wait``/
  ``step_async`` per stage, stages kept in flight), and ours with EnvPool's loop
  (``async_reset``, then ``recv(batch_size=num_envs // 2)`` / ``send(actions, env_ids)``,
  `prepare_send_recv`). Two rows bound what any backend can do on this machine: the
  "ceiling" row is the in-process step rate of one env times the cores this process may
  use (what the cores would give if each ran as fast alone as with the others busy), and
  the measured "parallel ceiling" row is one plain process per usable core, each
  stepping its share of the envs in a bare loop with no messages per step
  (`BareProcesses`): where cores share an execution unit (SMT siblings, a busy host)
  the second is the lower, and it is the one the ratios of a parallel backend are
  bounded by.
- **Null-env round trip** (microseconds): an env whose ``step`` does nothing, so the time
  per ``step()`` is pure framework cost: send actions, worker loop, shared-memory write,
  answer, info merge. Measured for one worker (latency of a single round trip) and for
  ``num_envs`` workers (wall time per vector step divided by the workers), next to
  ``AsyncVectorEnv``, SB3, and a bare ``multiprocessing.Pipe`` echo (the floor).

Two more workloads (the shared-memory fast path, docs/wire_format.md):

- **Slow env**: `BusyEnv` burning ``slow_ms`` (15) ms of CPU per step (LIBERO-like),
  ours with the fast path and with ``fast_path=False`` (the pickled path) side by side,
  ``SyncVectorEnv`` beside. Run with ``--only slow null`` and ``PYTHONPATH`` pointing at an
  older checkout to measure that checkout's path (its env has no ``fast_path`` switch: the
  pickled row is left out).
- **Decoupled**: `LatencyEnv` (step sleeps a lognormal time, median 5 ms, p99 about 10x),
  an off-CPU policy of 3 ms + 0.5 ms per observation, ``num_envs`` envs: decoupled
  ``send``/``recv`` in batches of ``num_envs // 2`` from one caller thread against a
  whole-env ``step`` loop. The zero-overhead ceiling of each loop is printed beside it
  (`decoupled_ceilings`, by sampling the same latencies and policy).

The targets are checked at the end (`targets`: each with its target, the
measured ratio and met / not met) and written to the JSON.

Run::

    python benchmarks/throughput.py                    # default, < 3 minutes on 2 idle cores
    python benchmarks/throughput.py --rounds 5 --steps 4000 --null-steps 20000  # steadier
    python benchmarks/throughput.py --help

Results go to ``benchmarks/results/throughput.json`` with the machine's description.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import tyro
from gymnasium import spaces

from pipelined_vec_env import PipelinedVectorEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import (  # noqa: E402
    cpu_model,
    cpu_seconds,
    git_commit,
    machine_identity,
    package_versions,
    relative_paths,
)

__all__ = ["Args", "Backend", "NullEnv", "main", "measure_null", "measure_throughput"]

# When imported as a plain module (tests load it from its path), worker processes cannot
# import it by name: ship its env classes and functions to them by value.
if __name__ != "__main__":
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

RESULTS = Path(__file__).resolve().parent / "results" / "throughput.json"


@dataclass
class Args:
    """Throughput benchmark options (the defaults run in under three minutes)."""

    env_id: str = "HalfCheetah-v5"
    """gymnasium id of the env to step (EnvPool must know the same id)."""
    num_envs: int = 8
    """Envs per vector env."""
    steps: int = 500
    """Vector steps timed per backend and round (``num_envs`` env steps each)."""
    warmup: int = 30
    """Vector steps run before timing starts."""
    rounds: int = 3
    """Rounds; each builds, times and closes every backend once. Medians are reported."""
    configs: tuple[str, ...] = ("default", "1x1", "1x2", "1x4", "2x2", "2x4")
    """Our configs for whole-env ``step``, as ``STAGESxENVS_PER_WORKER``, or ``default``
    (``PipelinedVectorEnv(fns)`` with no layout argument)."""
    staged: tuple[str, ...] = ("2x2", "2x4")
    """Our configs for the staged loop (``step_async``/``step_wait`` per stage)."""
    send_recv: tuple[str, ...] = ("default",)
    """Our configs for EnvPool-style ``async_reset`` / ``recv(batch_size=num_envs // 2)`` /
    ``send(actions, env_ids)``."""
    pin: bool = False
    """Also run each of our whole-env configs with ``cpu_affinity="auto"``."""
    baselines: bool = True
    """Run gymnasium Sync/Async and SB3 SubprocVecEnv (ratios need Sync and Async)."""
    envpool: bool = True
    """Run EnvPool (sync and async) when it is importable."""
    envpool_threads: int = 0
    """EnvPool ``num_threads`` (0: the cores this process may use)."""
    null_steps: int = 2000
    """Vector steps timed per null-env round-trip measurement (median of ``rounds``)."""
    slow_steps: int = 12
    """Vector steps timed per round on the synthetic CPU-bound env (0: skip it)."""
    slow_ms: float = 15.0
    """CPU time of one step of the synthetic slow env (LIBERO-like), in ms."""
    decoupled_steps: int = 60
    """Vector steps' worth of env steps timed per round in the decoupled workload (0: skip)."""
    only: tuple[str, ...] = ()
    """Run only these sections: ``throughput``, ``null``, ``slow``, ``decoupled``."""
    seed: int = 0
    """Seed for resets and for the random actions."""
    output: Path = RESULTS
    """Where the JSON results go."""


# ----------------------------------------------------------------------------- envs


class NullEnv(gym.Env):
    """An env whose ``step`` does nothing: a float32 ``(1,)`` observation, never done.

    Stepping it in a vector env measures the framework's round trip and nothing else.
    """

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self._obs = np.zeros(1, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return self._obs, {}

    def step(self, action: Any):
        return self._obs, 0.0, False, False, {}


#: The echo loop of `PipeEcho`, run with the builtin ``exec`` as the process target:
#: a builtin pickles by reference, so this works even when this file is not importable by
#: name in the child (the tests load it from its path).
_BARE_LOOP = """
import cloudpickle, numpy
env_fn, count, actions, seed = cloudpickle.loads(payload)
envs = [env_fn() for _ in range(count)]
for k, e in enumerate(envs):
    e.reset(seed=seed + k)
t = 0
while True:
    n = conn.recv()
    if n is None:
        break
    for _ in range(n):
        row = actions[t % len(actions)]
        for k, e in enumerate(envs):
            _, _, terminated, truncated, _ = e.step(row[k])
            if terminated or truncated:
                e.reset()
        t += 1
    conn.send(n * count)
"""

_ECHO_LOOP = """
while True:
    message = conn.recv()
    if message is None:
        break
    conn.send(message)
"""


# ----------------------------------------------------------------------------- backends


@dataclass
class Backend:
    """One way of stepping ``num_envs`` envs.

    Attributes:
        name: Row label.
        group: ``"gymnasium"``, ``"sb3"``, ``"envpool"``, ``"ours"`` or ``"reference"``.
        config: Settings that distinguish it, for the JSON.
        build: Makes the vector env (a fresh one per round).
        prepare: ``prepare(env, actions, seed)`` resets the env and returns its step
            loop.
        results: One dict per round (see `timed`).
    """

    name: str
    group: str
    config: dict[str, Any]
    build: Callable[[], Any]
    prepare: Callable[[Any, np.ndarray, int], Loop]
    results: list[dict[str, float]] = field(default_factory=list)


Loop = Callable[[int], int]
"""``loop(n)`` runs ``n`` vector steps' worth of env steps and returns the env steps done."""


def _whole_env_loop(env: Any, actions: np.ndarray) -> Loop:
    """``loop(n)``: ``n`` whole-env ``step`` calls with the pre-drawn actions; env steps done."""
    num_envs = actions.shape[1]

    def loop(n: int) -> int:
        for i in range(n):
            env.step(actions[i % len(actions)])
        return n * num_envs

    return loop


def prepare_vector(env: Any, actions: np.ndarray, seed: int) -> Loop:
    """Whole-env ``step`` loop for anything with gymnasium's (or SB3's) ``step``."""
    if hasattr(env, "single_action_space"):
        env.reset(seed=seed)
    else:  # SB3 VecEnv
        env.seed(seed)
        env.reset()
    return _whole_env_loop(env, actions)


def prepare_envpool_sync(env: Any, actions: np.ndarray, seed: int) -> Loop:
    """EnvPool's ``step`` on all envs (its seed is fixed by ``envpool.make(seed=...)``)."""
    env.reset()
    return _whole_env_loop(env, actions)


def prepare_staged(env: PipelinedVectorEnv, actions: np.ndarray, seed: int) -> Loop:
    """Staged loop: every stage stays in flight; collect stage s, send it its next actions.

    Each call of the loop starts every stage, cycles through the stages, and drains them at
    the end, so the env steps counted are exactly ``n * num_envs`` as for the other
    backends and nothing is left in flight between warm-up and timing.
    """
    env.reset(seed=seed)
    slices = env.stage_slices

    def loop(n: int) -> int:
        for s, sl in enumerate(slices):
            env.step_async(actions[0][sl], stage=s)
        for i in range(1, n):
            batch = actions[i % len(actions)]
            for s, sl in enumerate(slices):
                env.step_wait(stage=s)
                env.step_async(batch[sl], stage=s)
        for s in range(len(slices)):
            env.step_wait(stage=s)
        return n * env.num_envs

    return loop


def prepare_envpool_async(env: Any, actions: np.ndarray, seed: int) -> Loop:
    """EnvPool's async loop: ``recv`` a batch of ready envs, ``send`` their actions back."""
    env.async_reset()
    batch = env.config["batch_size"]
    num_envs = actions.shape[1]

    def loop(n: int) -> int:
        recvs = n * num_envs // batch
        for i in range(recvs):
            info = env.recv()[-1]
            env.send(actions[i % len(actions)][:batch], info["env_id"])
        return recvs * batch

    return loop


def prepare_send_recv(env: PipelinedVectorEnv, actions: np.ndarray, seed: int) -> Loop:
    """Our EnvPool-style loop: ``recv`` at least ``num_envs // 2`` ready envs, ``send`` their
    actions back.

    ``recv`` returns every result that is ready (it may be more than the batch), so the
    loop sends exactly ``n * num_envs`` actions (the env steps it counts: the last
    received envs may wait for the next call) and ends with nothing in flight (it receives
    every env; the next call sends those first).
    """
    env.async_reset(seed=seed)
    num_envs = env.num_envs
    batch = max(1, num_envs // 2)
    held = np.zeros(0, dtype=np.int64)  # envs received and not sent yet

    def loop(n: int) -> int:
        nonlocal held
        target, sent, i = n * num_envs, 0, 0
        while sent < target:
            if not len(held):
                held = env.recv(batch_size=batch)[-1]["env_id"]
            k = min(len(held), target - sent)
            env.send(actions[i % len(actions)][:k], held[:k])
            held, sent, i = held[k:], sent + k, i + 1
        while len(held) < num_envs:  # drain: nothing left in flight between calls
            ids = env.recv(batch_size=num_envs - len(held))[-1]["env_id"]
            held = np.concatenate([held, ids])
        return sent

    return loop


def prepare_single(env: gym.Env, actions: np.ndarray, seed: int) -> Loop:
    """One env stepped in this process (autoreset by hand): the per-step physics cost."""
    env.reset(seed=seed)
    per_vector_step = actions.shape[1]

    def loop(n: int) -> int:
        steps = n * per_vector_step
        for i in range(steps):
            _, _, terminated, truncated, _ = env.step(actions[i % len(actions), 0])
            if terminated or truncated:
                env.reset()
        return steps

    return loop


def worker_pids(env: Any) -> list[int]:
    """Pids of the env's worker processes (none for in-process backends)."""
    # ours: `workers` (`_handles` in older checkouts, for --trees runs)
    handles = getattr(env, "workers", None) or getattr(env, "_handles", None)
    if handles is not None:
        return [h.process.pid for h in handles]
    return [p.pid for p in getattr(env, "processes", [])]  # gymnasium Async, SB3


def timed(loop: Loop, iterations: int, warmup: int, pids: Sequence[int]) -> dict[str, float]:
    """Warm up, then time ``loop(iterations)``: wall time and CPU time of this process (its
    threads included) and of the worker processes ``pids``."""
    loop(warmup)
    workers_before = cpu_seconds(pids)
    wall, cpu = time.perf_counter(), time.process_time()
    env_steps = loop(iterations)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    workers_after = cpu_seconds(pids)
    workers = (
        None if workers_before is None or workers_after is None else workers_after - workers_before
    )
    return {
        "env_steps": env_steps,
        "seconds": wall,
        "steps_per_s": env_steps / wall,
        "parent_cpu_us_per_env_step": cpu / env_steps * 1e6,
        "worker_cpu_us_per_env_step": None if workers is None else workers / env_steps * 1e6,
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def parse_config(text: str) -> tuple[int, int | None]:
    """``"2x4"`` -> ``(num_stages=2, envs_per_worker=4)``; ``"default"`` -> ``(1, None)``
    (no layout argument: the layout `default_envs_per_worker` picks for this machine)."""
    if text.lower() == "default":
        return 1, None
    try:
        stages, per_worker = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(
            f"config: expected STAGESxENVS_PER_WORKER such as '2x4', got {text!r}"
        ) from None
    return stages, per_worker


def _envpool_module() -> Any | None:
    try:
        import envpool
    except Exception:  # ImportError, or a wheel that does not load on this machine
        return None
    return envpool


def make_backends(args: Args) -> list[Backend]:
    """The backends to measure, in the order they run within a round."""
    from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

    env_fn = functools.partial(gym.make, args.env_id)
    fns = [env_fn] * args.num_envs
    seed = args.seed
    vector = prepare_vector
    processes = min(len(_cores()), args.num_envs)
    bare_actions = _actions(gym.make(args.env_id), args.num_envs, np.random.default_rng(seed))
    backends = [
        Backend("single env, in-process", "reference", {"num_envs": 1}, env_fn, prepare_single),
        Backend(
            f"parallel ceiling ({processes} bare processes)",
            "reference",
            {"processes": processes},
            functools.partial(BareProcesses, env_fn, args.num_envs, processes, bare_actions, seed),
            prepare_bare,
        ),
    ]
    if args.baselines:
        from stable_baselines3.common.vec_env import SubprocVecEnv

        backends += [
            Backend("gymnasium SyncVectorEnv", "gymnasium", {}, lambda: SyncVectorEnv(fns), vector),
            Backend(
                "gymnasium AsyncVectorEnv",
                "gymnasium",
                {"shared_memory": True, "context": "forkserver"},
                lambda: AsyncVectorEnv(fns, shared_memory=True, context="forkserver"),
                vector,
            ),
            Backend(
                "SB3 SubprocVecEnv",
                "sb3",
                {"start_method": "forkserver"},
                lambda: SubprocVecEnv(fns, start_method="forkserver"),
                vector,
            ),
        ]
    envpool = _envpool_module() if args.envpool else None
    if envpool is not None:
        threads = args.envpool_threads or len(_cores())
        batch = max(1, args.num_envs // 2)

        def pool(batch_size: int) -> Callable[[], Any]:
            return lambda: envpool.make(
                args.env_id,
                env_type="gymnasium",
                num_envs=args.num_envs,
                batch_size=batch_size,
                num_threads=threads,
                seed=seed,
            )

        backends += [
            Backend(
                "EnvPool sync",
                "envpool",
                {"batch_size": args.num_envs, "num_threads": threads},
                pool(args.num_envs),
                prepare_envpool_sync,
            ),
            Backend(
                f"EnvPool async (batch {batch})",
                "envpool",
                {"batch_size": batch, "num_threads": threads},
                pool(batch),
                prepare_envpool_async,
            ),
        ]
    variants = [(c, None) for c in args.configs] + (
        [(c, "auto") for c in args.configs] if args.pin else []
    )
    for text, affinity in variants:
        stages, per_worker = parse_config(text)
        shape = "default" if per_worker is None else f"{stages}x{per_worker}"
        label = f"ours step {shape}" + (" pinned" if affinity else "")
        backends.append(
            Backend(
                label,
                "ours",
                {
                    "num_stages": stages,
                    "envs_per_worker": per_worker,
                    "cpu_affinity": affinity,
                    "loop": "step",
                },
                functools.partial(
                    PipelinedVectorEnv,
                    fns,
                    num_stages=stages,
                    envs_per_worker=per_worker,
                    cpu_affinity=affinity,
                ),
                vector,
            )
        )
    for text in args.send_recv:
        stages, per_worker = parse_config(text)
        shape = "default" if per_worker is None else f"{stages}x{per_worker}"
        backends.append(
            Backend(
                f"ours send/recv {shape} (batch {max(1, args.num_envs // 2)})",
                "ours",
                {
                    "num_stages": stages,
                    "envs_per_worker": per_worker,
                    "cpu_affinity": None,
                    "loop": "send_recv",
                },
                functools.partial(
                    PipelinedVectorEnv, fns, num_stages=stages, envs_per_worker=per_worker
                ),
                prepare_send_recv,
            )
        )
    for text in args.staged:
        stages, per_worker = parse_config(text)
        backends.append(
            Backend(
                f"ours staged {stages}x{per_worker}",
                "ours",
                {
                    "num_stages": stages,
                    "envs_per_worker": per_worker,
                    "cpu_affinity": None,
                    "loop": "staged",
                },
                functools.partial(
                    PipelinedVectorEnv, fns, num_stages=stages, envs_per_worker=per_worker
                ),
                prepare_staged,
            )
        )
    return backends


def _actions(env: Any, num_envs: int, rng: np.random.Generator, pool: int = 64) -> np.ndarray:
    space = getattr(env, "single_action_space", None) or env.action_space
    low, high = np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape)
    shape = (pool, num_envs, *space.shape)
    return rng.uniform(low, high, size=shape).astype(space.dtype)


def run_rounds(
    entries: Sequence[tuple[str, Callable[[], Any], Callable[[Any], Loop]]],
    rounds: int,
    steps: int,
    warmup: int,
) -> dict[str, list[dict[str, Any]]]:
    """Build every entry once, then time each in turn, ``rounds`` times round-robin.

    Interleaving spreads slow drift in the machine's load over every entry (paired
    ratios stay meaningful), and building once keeps start-up cost out of the run time.
    Idle workers block on their pipes, so the envs waiting their turn cost no CPU.

    Args:
        entries: ``(name, build, prepare)``: ``build()`` makes the vector env,
            ``prepare(env)`` resets it and returns its step loop.
        rounds: Times each entry is timed.
        steps: Vector steps per timing.
        warmup: Vector steps run before each timing.

    Returns:
        One list of `timed` results per entry name, one result per round.
    """
    envs: dict[str, Any] = {}
    loops: dict[str, Loop] = {}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in entries}
    try:
        for name, build, prepare in entries:
            envs[name] = build()
            loops[name] = prepare(envs[name])
        for r in range(rounds):
            for name, _, _ in entries:
                result = timed(loops[name], steps, warmup, worker_pids(envs[name]))
                results[name].append(result)
                load = result["loadavg_1min"]
                print(
                    f"  round {r + 1}/{rounds}  {name:34s} {result['steps_per_s']:9.0f} steps/s"
                    + ("" if load is None else f"  (load {load:.1f})"),
                    flush=True,
                )
    finally:
        for name, env in envs.items():
            try:
                env.close()
            except Exception as exc:  # close the others regardless
                print(f"  closing {name} failed: {exc!r}")
    return results


def measure_throughput(args: Args, backends: list[Backend]) -> None:
    """Time every backend ``args.rounds`` times, round-robin; results land on each backend."""
    rng = np.random.default_rng(args.seed)

    def preparer(b: Backend) -> Callable[[Any], Loop]:
        return lambda env: b.prepare(env, _actions(env, args.num_envs, rng), args.seed)

    entries = [(b.name, b.build, preparer(b)) for b in backends]
    results = run_rounds(entries, args.rounds, args.steps, args.warmup)
    for b in backends:
        b.results = results[b.name]


# ----------------------------------------------------------------------------- null env


class PipeEcho:
    """The floor for a worker round trip: one process echoing a tiny array over a bare
    ``multiprocessing.Pipe`` (forkserver), with just enough of the vector-env API to be
    timed like the others."""

    def __init__(self) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("forkserver")
        self.single_action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self._conn, child = ctx.Pipe()
        self.processes = [ctx.Process(target=exec, args=(_ECHO_LOOP, {"conn": child}), daemon=True)]
        self.processes[0].start()
        child.close()

    def reset(self, seed: int | None = None) -> None:
        """Nothing to reset."""

    def step(self, actions: np.ndarray) -> np.ndarray:
        """Send ``actions`` and return the echo."""
        self._conn.send(actions)
        return self._conn.recv()

    def close(self) -> None:
        """Stop the echo process."""
        self._conn.send(None)
        self.processes[0].join(5)
        self._conn.close()


class BareProcesses:
    """The measured parallel ceiling: one plain process per share of the envs, each
    stepping its envs in a loop of its own, told only how many vector steps to run.

    No message crosses per step, so its rate is what the machine gives that many busy
    processes stepping this env: the bound of any multi-process backend here.

    Args:
        env_fn: Makes one env (cloudpickled to the processes).
        num_envs: Envs in all, split as evenly as can be over ``processes``.
        processes: Processes, ``>= 1`` (at most ``num_envs`` are started).
        actions: ``(pool, num_envs, *action_shape)`` actions, used in turn.
        seed: Env ``k`` of a process is reset with ``seed + k``.
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        num_envs: int,
        processes: int,
        actions: np.ndarray,
        seed: int,
    ) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("forkserver")
        self.num_envs = num_envs
        probe = env_fn()
        self.single_action_space = probe.action_space  # the loop's actions are drawn here
        probe.close()
        bounds = np.linspace(0, num_envs, min(processes, num_envs) + 1).astype(int)
        self._conns, self.processes = [], []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            payload = cloudpickle.dumps((env_fn, int(hi - lo), actions[:, lo:hi], seed + int(lo)))
            conn, child = ctx.Pipe()
            namespace = {"conn": child, "payload": payload}
            process = ctx.Process(target=exec, args=(_BARE_LOOP, namespace), daemon=True)
            process.start()
            child.close()
            self._conns.append(conn)
            self.processes.append(process)

    def run(self, n: int) -> int:
        """Step every process's envs ``n`` vector steps, all at once; returns env steps."""
        for conn in self._conns:
            conn.send(n)
        return sum(conn.recv() for conn in self._conns)

    def close(self) -> None:
        """Stop the processes."""
        for conn in self._conns:
            conn.send(None)
        for process, conn in zip(self.processes, self._conns, strict=True):
            process.join(5)
            conn.close()


def prepare_bare(env: BareProcesses, actions: np.ndarray, seed: int) -> Loop:
    """The parallel ceiling's loop: its processes draw their own actions (set at build)."""
    return env.run


def measure_null(args: Args) -> list[dict[str, Any]]:
    """Null-env round trips, in microseconds per worker round trip (median over rounds).

    With ``n`` workers one vector step is ``n`` round trips served side by side, so the
    figure is wall time per vector step divided by ``n``; with one worker it is the
    latency of a single round trip. CPU time is split into this process and the workers.
    """
    from gymnasium.vector import AsyncVectorEnv
    from stable_baselines3.common.vec_env import SubprocVecEnv

    builders: list[tuple[str, int, Callable[[], Any]]] = []
    for n in sorted({1, args.num_envs}):
        builders += [
            ("ours", n, functools.partial(PipelinedVectorEnv, [NullEnv] * n)),
            *(
                [
                    (
                        "ours pickled (fast_path=False)",
                        n,
                        functools.partial(PipelinedVectorEnv, [NullEnv] * n, fast_path=False),
                    )
                ]
                if _accepts_fast_path()
                else []
            ),
            (
                "gymnasium AsyncVectorEnv",
                n,
                functools.partial(AsyncVectorEnv, [NullEnv] * n, context="forkserver"),
            ),
            (
                "SB3 SubprocVecEnv",
                n,
                functools.partial(SubprocVecEnv, [NullEnv] * n, start_method="forkserver"),
            ),
        ]
    builders.append(("bare Pipe echo", 1, PipeEcho))

    def prepare(n: int) -> Callable[[Any], Loop]:
        return lambda env: prepare_vector(env, np.zeros((1, n, 1), dtype=np.float32), args.seed)

    entries = [(f"null {name} x{n}", build, prepare(n)) for name, n, build in builders]
    timings = run_rounds(entries, args.rounds, args.null_steps, min(args.warmup, 100) + 1)
    rows = []
    for name, n, _ in builders:
        results = timings[f"null {name} x{n}"]
        rows.append(
            {
                "backend": name,
                "workers": n,
                "us_per_worker_round_trip": 1e6
                / statistics.median(r["steps_per_s"] for r in results),
                "parent_cpu_us": _median([r["parent_cpu_us_per_env_step"] for r in results]),
                "worker_cpu_us": _median([r["worker_cpu_us_per_env_step"] for r in results]),
                "rounds": results,
            }
        )
    return rows


# ----------------------------------------------------------------------------- slow env


def _accepts_fast_path() -> bool:
    """Whether this checkout's `PipelinedVectorEnv` has the ``fast_path`` switch (a run
    of this script against an older checkout, for the before/after figure, has not)."""
    import inspect

    return "fast_path" in inspect.signature(PipelinedVectorEnv).parameters


def measure_slow(args: Args) -> list[dict[str, Any]]:
    """The synthetic CPU-bound env (`BusyEnv`, ``slow_ms`` of CPU per step, LIBERO-like),
    ``num_envs`` envs, whole-env ``step``: ours (2 stages x 4 envs per worker) with the
    fast path and, when the checkout has the switch, pickled; ``SyncVectorEnv`` beside."""
    from gymnasium.vector import SyncVectorEnv

    from pipelined_vec_env.debug_envs import BusyEnv

    fns = [functools.partial(BusyEnv, step_seconds=args.slow_ms * 1e-3)] * args.num_envs
    per_worker = max(1, args.num_envs // 2)
    stages = min(2, args.num_envs)
    entries: list[tuple[str, Callable[[], Any], Callable[[Any], Loop]]] = []
    rng = np.random.default_rng(args.seed)

    def prepare(env: Any) -> Loop:
        return prepare_vector(env, _actions(env, args.num_envs, rng), args.seed)

    build = functools.partial(
        PipelinedVectorEnv, fns, num_stages=stages, envs_per_worker=per_worker
    )
    entries.append((f"slow ours step {stages}x{per_worker}", build, prepare))
    if _accepts_fast_path():
        entries.append(
            (
                f"slow ours step {stages}x{per_worker} pickled",
                functools.partial(build, fast_path=False),
                prepare,
            )
        )
    entries.append(("slow gymnasium SyncVectorEnv", lambda: SyncVectorEnv(fns), prepare))
    timings = run_rounds(entries, args.rounds, args.slow_steps, 2)
    return [
        {
            "name": name,
            "steps_per_s": statistics.median(r["steps_per_s"] for r in timings[name]),
            "rounds": timings[name],
        }
        for name, _, _ in entries
    ]


# ----------------------------------------------------------------------------- decoupled


class SleepPolicy:
    """An off-CPU policy (a GPU's forward pass, slept): ``a + b * batch`` seconds per call,
    returning zero actions for the batch."""

    def __init__(self, a: float, b: float, action_shape: tuple[int, ...]) -> None:
        self.a, self.b, self.action_shape = a, b, action_shape

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        time.sleep(self.a + self.b * len(obs))
        return np.zeros((len(obs), *self.action_shape), dtype=np.float32)


def measure_decoupled(args: Args) -> list[dict[str, Any]]:
    """Decoupled ``send``/``recv`` from one caller thread against a whole-env sync loop.

    ``num_envs`` `LatencyEnv` envs (step sleeps a lognormal time, median 5 ms, p99 about
    10x), one per worker; an off-CPU policy of 3 ms + 0.5 ms per observation. Sync:
    ``obs = step(policy(obs))`` for all envs. Decoupled: ``recv`` a batch of
    ``num_envs // 2`` ready envs, infer, ``send`` their actions back.
    """
    from pipelined_vec_env.debug_envs import LatencyEnv

    fns = [
        functools.partial(LatencyEnv, median_seconds=0.005, sigma=0.99, latency_seed=i)
        for i in range(args.num_envs)
    ]
    batch = max(1, args.num_envs // 2)

    def build() -> PipelinedVectorEnv:
        return PipelinedVectorEnv(fns)

    def policy_for(env: Any) -> SleepPolicy:
        return SleepPolicy(3e-3, 0.5e-3, env.single_action_space.shape)

    def prepare_sync(env: Any) -> Loop:
        policy = policy_for(env)
        state = {"obs": env.reset(seed=args.seed)[0]}

        def loop(n: int) -> int:
            for _ in range(n):
                state["obs"] = env.step(policy(state["obs"]))[0]
            return n * env.num_envs

        return loop

    def prepare_decoupled(env: Any) -> Loop:
        policy = policy_for(env)
        env.async_reset(seed=args.seed)

        def loop(n: int) -> int:
            stepped = 0  # recv may return more than the batch: count what was sent
            for _ in range(n * env.num_envs // batch):
                obs, _, _, _, info = env.recv(batch_size=batch)
                env.send(policy(obs), info["env_id"])
                stepped += len(info["env_id"])
            return stepped

        return loop

    entries = [
        ("decoupled workload: sync step loop", build, prepare_sync),
        (f"decoupled workload: send/recv (batch {batch})", build, prepare_decoupled),
    ]
    timings = run_rounds(entries, args.rounds, args.decoupled_steps, 5)
    ceilings = decoupled_ceilings(args.num_envs, batch, np.random.default_rng(args.seed))
    return [
        {
            "name": name,
            "steps_per_s": statistics.median(r["steps_per_s"] for r in timings[name]),
            "ceiling_steps_per_s": ceiling,
            "rounds": timings[name],
        }
        for (name, _, _), ceiling in zip(entries, ceilings, strict=True)
    ]


def decoupled_ceilings(
    num_envs: int, batch: int, rng: np.random.Generator, rounds: int = 20_000
) -> tuple[float, float]:
    """Env steps/s of the two decoupled-workload loops with a framework that costs
    nothing, by sampling the same latencies (lognormal, median 5 ms, sigma 0.99) and
    policy (3 ms + 0.5 ms per observation): ``(sync, decoupled)``.

    Sync: each round waits for the slowest of ``num_envs`` steps, then infers all.
    Decoupled: wait until ``batch`` envs are ready, infer every ready env, send; the
    others keep stepping meanwhile.
    """

    def latency(size: Any = None) -> Any:
        return 5e-3 * np.exp(0.99 * rng.standard_normal(size))

    sync_time = float(np.sum(latency((rounds, num_envs)).max(axis=1) + 3e-3 + 0.5e-3 * num_envs))
    sync = rounds * num_envs / sync_time
    t, steps = 0.0, 0
    ready = latency(num_envs)
    for _ in range(rounds):
        t = max(t, float(np.sort(ready)[batch - 1]))
        chosen = ready <= t
        t += 3e-3 + 0.5e-3 * int(chosen.sum())
        ready[chosen] = t + latency(int(chosen.sum()))
        steps += int(chosen.sum())
    return sync, steps / t


# ----------------------------------------------------------------------------- report


def _cores() -> list[int]:
    return (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, Python, package versions and load: what a reader needs to compare."""
    repo = Path(__file__).resolve().parents[1]

    def git(*argv: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *argv], capture_output=True, text=True, cwd=repo, check=False
            )
        except OSError:
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    import pipelined_vec_env

    package_dir = Path(pipelined_vec_env.__file__).resolve().parent
    in_repo = package_dir == repo / "pipelined_vec_env"
    packages = (
        "pipelined-vec-env",
        "gymnasium",
        "mujoco",
        "numpy",
        "cloudpickle",
        "stable-baselines3",
        "envpool",
    )
    return {
        **machine_identity(),
        "cpu_count": os.cpu_count(),
        "usable_cores": len(_cores()),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(packages),
        "git_commit": git_commit(repo),
        "pipelined_vec_env_path": str(package_dir),
        # uncommitted edits to the measured core make the commit above a lie
        "core_has_uncommitted_changes": bool(
            git("diff", "--stat", "HEAD", "--", "pipelined_vec_env")
        )
        if in_repo
        else None,
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(backends: list[Backend]) -> list[dict[str, Any]]:
    """One row per backend: median steps/s over rounds, and ratios to Sync and Async.

    Ratios are taken within each round (both backends measured minutes apart at most)
    and the median of those paired ratios is reported, which resists load drift better
    than a ratio of medians.
    """
    by_name = {b.name: b for b in backends}

    def paired(values: list[float], reference: str) -> float | None:
        ref = by_name.get(reference)
        if ref is None or not values:
            return None
        return _median([v / r["steps_per_s"] for v, r in zip(values, ref.results, strict=True)])

    rows = []
    for b in backends:
        sps = [r["steps_per_s"] for r in b.results]
        parent = _median([r["parent_cpu_us_per_env_step"] for r in b.results])
        workers = (
            _median([r["worker_cpu_us_per_env_step"] for r in b.results]) if b.results else None
        )
        rows.append(
            {
                "name": b.name,
                "group": b.group,
                "config": b.config,
                "steps_per_s": statistics.median(sps),
                "steps_per_s_min": min(sps),
                "steps_per_s_max": max(sps),
                "vs_sync": paired(sps, "gymnasium SyncVectorEnv"),
                "vs_async": paired(sps, "gymnasium AsyncVectorEnv"),
                "parent_cpu_us_per_env_step": parent,
                "worker_cpu_us_per_env_step": workers,
                "total_cpu_us_per_env_step": None if parent is None else parent + (workers or 0.0),
                "rounds": b.results,
            }
        )
    single = by_name.get("single env, in-process")
    if single is not None and single.results:
        cores = len(_cores())
        ceiling = [cores * r["steps_per_s"] for r in single.results]
        rows.append(
            {
                "name": f"ceiling ({cores} cores x single env)",
                "group": "reference",
                "config": {"cores": cores},
                "steps_per_s": statistics.median(ceiling),
                "vs_sync": paired(ceiling, "gymnasium SyncVectorEnv"),
                "vs_async": paired(ceiling, "gymnasium AsyncVectorEnv"),
            }
        )
    return rows


def _fmt(x: float | None, spec: str = ".0f", suffix: str = "") -> str:
    return "" if x is None else f"{x:{spec}}{suffix}"


def _throughput_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| backend | env steps/s (median) | min-max | vs Sync | vs Async | CPU us/env step: main + workers |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        spread = (
            f"{row['steps_per_s_min']:.0f}-{row['steps_per_s_max']:.0f}"
            if "steps_per_s_min" in row
            else ""
        )
        cpu = ""
        if row.get("parent_cpu_us_per_env_step") is not None:
            cpu = f"{row['parent_cpu_us_per_env_step']:.0f}"
            if row.get("worker_cpu_us_per_env_step"):
                cpu += f" + {row['worker_cpu_us_per_env_step']:.0f}"
        lines.append(
            f"| {row['name']} | {row['steps_per_s']:.0f} | {spread} | {_fmt(row['vs_sync'], '.2f', 'x')} "
            f"| {_fmt(row['vs_async'], '.2f', 'x')} | {cpu} |"
        )
    return lines


def _null_lines(null_rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| null env | workers | wall us per worker round trip | CPU us: main | CPU us: workers |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in null_rows:
        lines.append(
            f"| {row['backend']} | {row['workers']} | {row['us_per_worker_round_trip']:.1f} "
            f"| {_fmt(row['parent_cpu_us'], '.1f')} | {_fmt(row['worker_cpu_us'], '.1f')} |"
        )
    return lines


def format_table(rows: list[dict[str, Any]], null_rows: list[dict[str, Any]]) -> str:
    """The markdown tables printed at the end: the throughput rows, then the null env's."""
    return "\n".join([*_throughput_lines(rows), "", *_null_lines(null_rows)])


def throughput_table(result: dict[str, Any]) -> str:
    """The throughput table of a result file (the whole JSON), as ``docs/benchmarks.md``
    shows it."""
    return "\n".join(_throughput_lines(result["throughput"]))


def null_table(result: dict[str, Any]) -> str:
    """The null env's table of a result file (the whole JSON)."""
    return "\n".join(_null_lines(result["null_round_trip"]))


def workloads_table(result: dict[str, Any]) -> str:
    """The slow env's and the decoupled workload's rows of a result file (the whole JSON)."""
    return format_extra(result["slow_env"] + result["decoupled"])


def _paired(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """Median over rounds of ``a``'s rate over ``b``'s in the same round."""
    if a is None or b is None or not a.get("rounds") or not b.get("rounds"):
        return None
    return _median(
        [x["steps_per_s"] / y["steps_per_s"] for x, y in zip(a["rounds"], b["rounds"], strict=True)]
    )


def _best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row with the highest ``vs_sync`` (the median of its per-round paired ratios to
    ``SyncVectorEnv``); by median steps/s where Sync was not run. None for no rows."""
    if not rows:
        return None
    if all(r.get("vs_sync") is not None for r in rows):
        return max(rows, key=lambda r: r["vs_sync"])
    return max(rows, key=lambda r: r["steps_per_s"])


def _target(measured: float | None, target: float, at_least: bool = True) -> dict[str, Any]:
    met = None if measured is None else (measured >= target if at_least else measured <= target)
    return {"target": target, "measured": measured, "met": met}


#: The tolerance of "no slower" on the slow env: run-to-run noise of a paired ratio on a
#: shared machine is a few percent.
SLOW_TOLERANCE = 0.97


def targets(
    rows: list[dict[str, Any]],
    null_rows: list[dict[str, Any]],
    slow_rows: list[dict[str, Any]] | None = None,
    decoupled_rows: list[dict[str, Any]] | None = None,
    *,
    num_envs: int = 8,
) -> dict[str, Any]:
    """The fast path's targets, checked against this run (each: target, measured, met).

    Every ratio of two backends is the median of their per-round paired ratios (`_paired`),
    and "best" is the config with the highest such ratio to ``SyncVectorEnv`` (`_best`).

    - ``vs_sync`` / ``vs_envpool_async``: our best whole-env ``step`` config on the
      throughput env over ``SyncVectorEnv`` (>= 1.5x) and EnvPool async (>= 0.8x).
    - ``staged_vs_step``: our best staged loop over our best whole-env ``step`` (>= 1.0).
    - ``overhead_us``: framework CPU per env step at 4 envs per worker (parent + workers,
      spinning included, minus the in-process single env's CPU per step), <= 10 us.
    - ``null_vs_echo``: one-worker null ``step()`` over a bare pipe echo, <= 0.7.
    - ``slow_env``: the synthetic CPU-bound env, fast path over the pickled path, no
      slower (>= `SLOW_TOLERANCE`).
    - ``decoupled``: decoupled send/recv over a whole-env sync loop, >= 2.0x.
    - ``vs_async``: our best over ``AsyncVectorEnv`` (>= 3.0x).
    - ``default_vs_sync``: ``PipelinedVectorEnv(fns)`` with no layout argument (the row
      ``ours step default``) over ``SyncVectorEnv``: >= 1.1x below 32 envs, >= 1.5x from 32.
    - ``send_recv_vs_step`` / ``send_recv_vs_envpool_async``: our EnvPool-style loop with
      the default layout (``ours send/recv default``) over the whole-env ``step`` of the
      same layout (>= 1.0) and over EnvPool async (>= 0.8).
    - ``parallel_ceiling`` (no target): the measured parallel ceiling (`BareProcesses`)
      over ``SyncVectorEnv`` and over EnvPool async, the most a multi-process backend
      could show on this machine.
    """
    by_name = {r["name"]: r for r in rows}
    whole = [r for r in rows if r["group"] == "ours" and r["config"].get("loop") == "step"]
    staged = [r for r in rows if r["group"] == "ours" and r["config"].get("loop") == "staged"]
    best = _best(whole)
    best_staged = _best(staged)
    envpool_async = next((r for r in rows if r["name"].startswith("EnvPool async")), None)
    single = by_name.get("single env, in-process")
    result: dict[str, Any] = {"best_ours": best["name"] if best else None}
    result["vs_sync"] = _target(best["vs_sync"] if best else None, 1.5)
    result["vs_async"] = _target(best["vs_async"] if best else None, 3.0)
    result["vs_envpool_async"] = _target(_paired(best, envpool_async), 0.8)
    if envpool_async is None:
        result["vs_envpool_async"]["note"] = "EnvPool not importable: not measured"
    result["staged_vs_step"] = _target(_paired(best_staged, best), 1.0)
    if best_staged:
        result["staged_vs_step"]["staged"] = best_staged["name"]
    four = [
        r
        for r in whole
        if r["config"].get("envs_per_worker") == 4 and r.get("total_cpu_us_per_env_step")
    ]
    physics = single.get("parent_cpu_us_per_env_step") if single else None
    overheads = {
        r["name"]: r["total_cpu_us_per_env_step"] - physics for r in four if physics is not None
    }
    result["overhead_us"] = _target(min(overheads.values()) if overheads else None, 10.0, False)
    result["overhead_us"]["per_config"] = overheads
    result["overhead_us"]["single_env_cpu_us"] = physics
    ours_null = next((r for r in null_rows if r["backend"] == "ours" and r["workers"] == 1), None)
    echo = next((r for r in null_rows if r["backend"] == "bare Pipe echo"), None)
    result["null_vs_echo"] = _target(
        ours_null["us_per_worker_round_trip"] / echo["us_per_worker_round_trip"]
        if ours_null and echo
        else None,
        0.7,
        False,
    )
    default = next((r for r in whole if r["config"].get("envs_per_worker") is None), None)
    result["default_vs_sync"] = _target(
        default["vs_sync"] if default else None, 1.5 if num_envs >= 32 else 1.1
    )
    send_recv = next(
        (
            r
            for r in rows
            if r["group"] == "ours"
            and r["config"].get("loop") == "send_recv"
            and r["config"].get("envs_per_worker") is None
        ),
        None,
    )
    result["send_recv_vs_step"] = _target(_paired(send_recv, default), 1.0)
    bare = next((r for r in rows if r["name"].startswith("parallel ceiling")), None)
    if bare is not None:  # what plain processes reach here: no multi-process backend passes it
        result["parallel_ceiling"] = {
            "vs_sync": bare.get("vs_sync"),
            "vs_envpool_async": _paired(bare, envpool_async),
        }
    result["send_recv_vs_envpool_async"] = _target(_paired(send_recv, envpool_async), 0.8)
    if slow_rows:
        fast = next((r for r in slow_rows if r["name"].startswith("slow ours")), None)
        pickled = next((r for r in slow_rows if r["name"].endswith("pickled")), None)
        result["slow_env"] = _target(_paired(fast, pickled), SLOW_TOLERANCE)
    if decoupled_rows and len(decoupled_rows) == 2:
        result["decoupled"] = _target(_paired(decoupled_rows[1], decoupled_rows[0]), 2.0)
        sync_ceiling = decoupled_rows[0].get("ceiling_steps_per_s")
        dec_ceiling = decoupled_rows[1].get("ceiling_steps_per_s")
        if sync_ceiling and dec_ceiling:
            result["decoupled"]["ceiling_ratio"] = dec_ceiling / sync_ceiling
    return result


def format_extra(rows: list[dict[str, Any]]) -> str:
    """A table of a workload's rows (slow env, decoupled)."""
    lines = [
        "| workload | env steps/s (median) | per round | zero-overhead ceiling |",
        "|---|---:|---|---:|",
    ]
    for row in rows:
        per_round = ", ".join(f"{r['steps_per_s']:.0f}" for r in row["rounds"])
        ceiling = _fmt(row.get("ceiling_steps_per_s"), ".0f")
        lines.append(f"| {row['name']} | {row['steps_per_s']:.1f} | {per_round} | {ceiling} |")
    return "\n".join(lines)


def format_targets(result: dict[str, Any]) -> str:
    """The targets as a markdown table."""
    lines = ["| target | wanted | measured | met |", "|---|---:|---:|---|"]
    for key, value in result.items():
        if not isinstance(value, dict) or "target" not in value:
            continue
        sign = ">=" if key not in ("overhead_us", "null_vs_echo") else "<="
        measured = "" if value["measured"] is None else f"{value['measured']:.2f}"
        met = {True: "met", False: "NOT met", None: "not measured"}[value["met"]]
        lines.append(f"| {key} | {sign} {value['target']:g} | {measured} | {met} |")
    bound = result.get("parallel_ceiling")
    if bound:
        parts = [f"{v:.2f}x {k[3:]}" for k, v in bound.items() if v is not None]
        lines += [
            "",
            "Measured parallel ceiling (bare processes, no framework): " + ", ".join(parts),
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and write the JSON; returns what was written."""
    args = tyro.cli(Args, args=argv)
    info = machine_info()
    print(
        f"{info['cpu_model']}, {info['usable_cores']} usable cores, Python {info['python']}, load {info['loadavg_at_start']}"
    )
    sections = set(args.only or ("throughput", "null", "slow", "decoupled"))
    backends = make_backends(args) if "throughput" in sections else []
    if args.envpool and _envpool_module() is None:
        print("  EnvPool is not importable: skipped")
    start = time.perf_counter()
    if backends:
        print(
            f"throughput: {args.env_id}, {args.num_envs} envs, {args.steps} vector steps x {args.rounds} rounds"
        )
        measure_throughput(args, backends)
    null_rows: list[dict[str, Any]] = []
    if "null" in sections:
        print("null-env round trips")
        null_rows = measure_null(args)
    slow_rows: list[dict[str, Any]] = []
    if "slow" in sections and args.slow_steps:
        print(f"slow env: {args.slow_ms:g} ms of CPU per step")
        slow_rows = measure_slow(args)
    decoupled_rows: list[dict[str, Any]] = []
    if "decoupled" in sections and args.decoupled_steps:
        print("decoupled workload: lognormal env (median 5 ms), policy 3 ms + 0.5 ms/obs")
        decoupled_rows = measure_decoupled(args)
    rows = summarise(backends)
    info["loadavg_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    result = {
        "machine": info,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(args).items()},
        "seconds": time.perf_counter() - start,
        "throughput": rows,
        "null_round_trip": null_rows,
        "slow_env": slow_rows,
        "decoupled": decoupled_rows,
        "targets": targets(rows, null_rows, slow_rows, decoupled_rows, num_envs=args.num_envs),
        "envpool_available": _envpool_module() is not None,
    }
    print()
    print(format_table(rows, null_rows))
    for extra in (slow_rows, decoupled_rows):
        if extra:
            print()
            print(format_extra(extra))
    print()
    print(format_targets(result["targets"]))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(relative_paths(result), indent=1) + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
