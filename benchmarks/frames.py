"""Camera frames through vector envs: env steps/s, GB/s of frames delivered, and both as a
share of the machine's memory-copy limit.

A VLA rollout moves camera frames (two 224x224 RGB images an env step: 301 KB) from the
simulators to the policy. This benchmark steps `CameraEnv` (pre-built frames, so only
their transport is timed; cameras, side, state size and CPU cost per step are arguments)
through:

- gymnasium ``SyncVectorEnv`` (one process: each frame copied into the batch, then the
  batch copied out, ``copy=True``), ``AsyncVectorEnv`` (shared memory,
  ``context="forkserver"``: with fork it hangs at build under EGL), SB3 ``SubprocVecEnv``
  (frames pickled through pipes, as verl and RLinf do);
- ours: whole-env ``step`` (``copy=True``, the default: views of a generation of the
  shared buffers that nothing the caller holds refers to, `observation_ring`), the same
  with the ring off (``shared_observations`` read first: each step's frames copied out
  of the shared buffers, as when the caller keeps every batch), ``step`` with
  ``copy=False`` (views of the shared buffers: the caller copies nothing), a staged loop
  (2 stages kept in flight) and EnvPool's ``recv``/``send`` loop (batches of
  ``num_envs // 2``);
- the limit: one ``np.copyto`` of a batch's frame bytes per vector step, in this process
  (what one copy of every frame costs on this machine); and where envs burn CPU, the
  measured parallel ceiling (`throughput.BareProcesses`: one plain process per usable core
  stepping its envs, no messages).

Rounds are interleaved (every backend timed once per round, in turn; ratios are medians of
per-round paired ratios, as in ``benchmarks/throughput.py``, whose helpers this reuses).
``--libero`` adds real ``LiberoEnv`` envs with both cameras (0.1-0.2 s an env step on a
CPU: a few steps, each backend built and closed in its turn, about 2 GB an env).

Two more measurements say where a frame's time goes:

- **per copy**: ours with ``profile=True`` on one case (``copy=True`` with and without
  the ring, ``copy=False``): the workers' step commands (the env steps and the write of
  their frames into shared memory), the caller's copies out of shared memory
  (``"observation copy"`` spans, one per worker as it answers, and the rows left at the
  end), and the wall time per step;
- **the workers' write**: gymnasium's ``write_to_shared_memory`` (each array flattened,
  a copy, then copied into the buffer) against `RowWriter` (one copy per array) writing
  one worker's share of frames, in this process, interleaved.

Run::

    python benchmarks/frames.py --quick          # 8 envs at 224 px, 4 with CPU cost (~30 s)
    python benchmarks/frames.py                  # 8/32/64 envs at 224/256 px (~10 min)
    python benchmarks/frames.py --libero         # and 2 LIBERO envs with both cameras

Results go to ``benchmarks/results/frames.json`` (and the table beside it, ``.md``);
``--quick``'s to ``frames_quick.json`` (git ignores it), unless ``--output`` says where.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers, also when loaded by path
import throughput  # noqa: E402
from _machine import run_record, write_results  # noqa: E402

from pipelined_vec_env import PipelinedVectorEnv  # noqa: E402
from pipelined_vec_env.debug_envs import CameraEnv  # noqa: E402

__all__ = ["Args", "format_table", "format_time", "main"]

if __name__ != "__main__":
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "frames.json"
SYNC = "gymnasium SyncVectorEnv"
LIMIT = "limit: one np.copyto of the batch"
CEILING = "parallel ceiling"


@dataclass
class Args:
    """Frames benchmark options (the defaults take about 10 minutes on 2 idle cores)."""

    envs: tuple[int, ...] = (8, 32, 64)
    """Envs per vector env, for the cases with no env cost."""
    sides: tuple[int, ...] = (224, 256)
    """Image sides (pixels), for the cases with no env cost."""
    cpu_cases: tuple[str, ...] = ("16x224x2",)
    """Cases whose envs burn CPU, as ``ENVSxSIDExMS`` (CPU milliseconds per env step)."""
    cameras: int = 2
    """Camera images per observation."""
    state_size: int = 9
    """State entries per observation."""
    steps: int = 300
    """Vector steps timed per backend and round (at 32 envs of 224 px, a few tenths of a
    second of ours or Sync; 60-step windows spread the per-round ratios wider:
    ``frames_windows.py``, benchmarks/results/frames_windows_60_vs_300.json)."""
    cpu_steps: int = 20
    """Vector steps timed per backend and round in the CPU-cost cases."""
    warmup: int = 5
    """Vector steps run before each timing."""
    rounds: int = 5
    """Rounds (every backend timed once per round, in turn)."""
    backends: tuple[str, ...] = (
        "sync",
        "async",
        "sb3",
        "step",
        "copies",
        "nocopy",
        "staged",
        "recv",
    )
    """Backends: any of sync, async, sb3, step, copies, nocopy, staged, recv (the limit
    always)."""
    profile_case: str = "32x224"
    """``ENVSxSIDE`` of the where-the-time-goes measurement ("" to skip it)."""
    profile_steps: int = 200
    """Vector steps of that measurement."""
    libero: bool = False
    """Also step real LiberoEnv envs with both cameras (slow: keep the numbers small)."""
    libero_envs: int = 2
    """LIBERO envs."""
    libero_side: int = 224
    """LIBERO camera side (pixels)."""
    libero_steps: int = 3
    """LIBERO vector steps timed per backend and round."""
    libero_rounds: int = 1
    """LIBERO rounds."""
    quick: bool = False
    """8 envs at 224 px, a 4-env CPU-cost case, few steps and rounds: shows it works (its
    figures are noisy; written to ``frames_quick.json`` unless ``--output`` is given)."""
    seed: int = 0
    """Seed of the resets and actions."""
    output: Path = RESULTS
    """Where the JSON goes (the markdown table beside it)."""

    def __post_init__(self) -> None:
        if self.quick:
            if self.output == RESULTS:  # the committed results stay the full run's
                self.output = RESULTS.with_name("frames_quick.json")
            self.envs, self.sides, self.cpu_cases = (8,), (224,), ("4x224x2",)
            self.steps, self.cpu_steps, self.warmup, self.rounds = 10, 5, 2, 2
            self.profile_case, self.profile_steps = "8x224", 20
            self.libero_steps = min(self.libero_steps, 2)


# ----------------------------------------------------------------------------- the limit


class CopyLimit:
    """One ``np.copyto`` of a batch's frame bytes per vector step, in this process: what
    delivering every frame once costs here, the limit of any backend's frame rate.

    Args:
        num_envs: Envs of the batch.
        frame_bytes: Frame bytes of one env step.
    """

    def __init__(self, num_envs: int, frame_bytes: int) -> None:
        self.num_envs = num_envs
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        self._source = np.random.default_rng(0).integers(
            0, 256, num_envs * frame_bytes, dtype=np.uint8
        )
        self._target = np.empty_like(self._source)

    def run(self, n: int) -> int:
        """Copy the batch ``n`` times; returns the env steps that stands for."""
        for _ in range(n):
            np.copyto(self._target, self._source)
        return n * self.num_envs

    def close(self) -> None:
        """Nothing to stop."""


def _prepare_limit(env: CopyLimit, actions: np.ndarray, seed: int) -> throughput.Loop:
    return env.run


# ----------------------------------------------------------------------------- backends


@dataclass
class Case:
    """One workload: ``num_envs`` envs returning ``cameras`` frames of ``side`` px."""

    name: str
    num_envs: int
    side: int
    cpu_ms: float
    env_fn: Callable[[], gym.Env]
    frame_bytes: int
    steps: int


def _sb3(fns: list[Callable[[], gym.Env]]) -> Any:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    return SubprocVecEnv(fns, start_method="forkserver")


def _without_ring(envs: PipelinedVectorEnv) -> PipelinedVectorEnv:
    """``envs`` with its observation ring off: reading ``shared_observations`` ends it,
    so each ``copy=True`` step copies its frames out of the shared buffers."""
    assert envs.shared_observations is not None
    return envs


def make_backends(case: Case, names: Sequence[str]) -> list[throughput.Backend]:
    """The backends ``names`` for ``case``, then the limit and (envs with a CPU cost) the
    parallel ceiling."""
    n, fn = case.num_envs, case.env_fn
    fns = [fn] * n
    Backend = throughput.Backend
    table: dict[str, Backend] = {
        "sync": Backend(
            SYNC, "gymnasium", {}, lambda: gym.vector.SyncVectorEnv(fns), throughput.prepare_vector
        ),
        "async": Backend(
            "gymnasium AsyncVectorEnv",
            "gymnasium",
            {"shared_memory": True, "context": "forkserver"},
            lambda: gym.vector.AsyncVectorEnv(fns, shared_memory=True, context="forkserver"),
            throughput.prepare_vector,
        ),
        "sb3": Backend(
            "SB3 SubprocVecEnv (pickled)", "sb3", {}, lambda: _sb3(fns), throughput.prepare_vector
        ),
        "step": Backend(
            "ours step",
            "ours",
            {"loop": "step", "copy": True},
            lambda: PipelinedVectorEnv(fns),
            throughput.prepare_vector,
        ),
        "copies": Backend(
            "ours step, no ring (copies)",
            "ours",
            {"loop": "step", "copy": True, "ring": False},
            lambda: _without_ring(PipelinedVectorEnv(fns)),
            throughput.prepare_vector,
        ),
        "nocopy": Backend(
            "ours step copy=False",
            "ours",
            {"loop": "step", "copy": False},
            lambda: PipelinedVectorEnv(fns, copy=False),
            throughput.prepare_vector,
        ),
        "staged": Backend(
            "ours staged (2 stages)",
            "ours",
            {"loop": "staged", "num_stages": 2},
            lambda: PipelinedVectorEnv(fns, num_stages=min(2, n)),
            throughput.prepare_staged,
        ),
        "recv": Backend(
            "ours recv/send (n/2)",
            "ours",
            {"loop": "send_recv"},
            lambda: PipelinedVectorEnv(fns),
            throughput.prepare_send_recv,
        ),
    }
    unknown = [name for name in names if name not in table]
    if unknown:
        raise ValueError(f"--backends: unknown {unknown}; choose from {list(table)}")
    if "sb3" in names and importlib.util.find_spec("stable_baselines3") is None:
        print(
            "  (SB3 SubprocVecEnv left out: stable-baselines3 is not installed; pip install"
            ' -e ".[sb3]" adds it)'
        )
        names = [name for name in names if name != "sb3"]
    backends = [table[name] for name in names]
    backends.append(
        Backend(
            LIMIT,
            "reference",
            {},
            lambda: CopyLimit(n, case.frame_bytes),
            _prepare_limit,
        )
    )
    if case.cpu_ms > 0:
        cores = len(throughput._cores())
        actions = np.zeros((1, n, 7), np.float32)
        backends.append(
            Backend(
                CEILING,
                "reference",
                {"processes": cores},
                lambda: throughput.BareProcesses(fn, n, cores, actions, 0),
                throughput.prepare_bare,
            )
        )
    return backends


# ----------------------------------------------------------------------------- running


def _entries(backends: list[throughput.Backend], case: Case, seed: int) -> list:
    rng = np.random.default_rng(seed)

    def preparer(b: throughput.Backend) -> Callable[[Any], throughput.Loop]:
        return lambda env: b.prepare(env, throughput._actions(env, case.num_envs, rng), seed)

    return [(b.name, b.build, preparer(b)) for b in backends]


def run_one_at_a_time(entries: list, rounds: int, steps: int, warmup: int) -> dict[str, list]:
    """`throughput.run_rounds`, each backend built and closed in its turn (LIBERO envs
    hold about 2 GB each: one backend's envs at a time)."""
    results: dict[str, list] = {name: [] for name, _, _ in entries}
    for r in range(rounds):
        for name, build, prepare in entries:
            env = build()
            try:
                result = throughput.timed(prepare(env), steps, warmup, throughput.worker_pids(env))
            finally:
                env.close()
            results[name].append(result)
            print(f"  round {r + 1}/{rounds}  {name:34s} {result['steps_per_s']:9.1f} steps/s")
    return results


def _paired(values: list[float], reference: list[float] | None) -> float | None:
    if not reference:
        return None
    return statistics.median(v / r for v, r in zip(values, reference, strict=True))


def measure_case(case: Case, args: Args, one_at_a_time: bool = False) -> dict[str, Any]:
    """Time every backend on ``case``; its rows with steps/s, GB/s and the ratios."""
    print(f"case {case.name}", flush=True)
    backends = make_backends(case, args.backends)
    entries = _entries(backends, case, args.seed)
    if one_at_a_time:
        results = run_one_at_a_time(entries, args.libero_rounds, case.steps, 1)
    else:
        results = throughput.run_rounds(entries, args.rounds, case.steps, args.warmup)
    for b in backends:
        b.results = results[b.name]
    rows = throughput.summarise(backends)
    rates = {b.name: [r["steps_per_s"] for r in b.results] for b in backends}
    for row in rows:
        sps = rates[row["name"]]
        row["frames_gb_per_s"] = row["steps_per_s"] * case.frame_bytes / 1e9
        row["share_of_limit"] = _paired(sps, rates.get(LIMIT))
        row["vs_ceiling"] = _paired(sps, rates.get(CEILING))
    return {
        "case": case.name,
        "num_envs": case.num_envs,
        "side": case.side,
        "cpu_ms": case.cpu_ms,
        "frame_bytes_per_env_step": case.frame_bytes,
        "steps": case.steps,
        "rows": rows,
    }


def camera_case(args: Args, num_envs: int, side: int, cpu_ms: float, steps: int) -> Case:
    cameras, state_size, seconds = args.cameras, args.state_size, cpu_ms / 1e3

    def env_fn() -> gym.Env:
        return CameraEnv(cameras, side, state_size, step_seconds=seconds)

    name = f"{num_envs} envs, {side} px" + (f", {cpu_ms:g} ms CPU" if cpu_ms else "")
    return Case(name, num_envs, side, cpu_ms, env_fn, cameras * side * side * 3, steps)


def libero_case(args: Args) -> Case:
    side = args.libero_side

    def env_fn() -> gym.Env:
        from pipelined_vec_env.libero.env import LiberoEnv

        return LiberoEnv("libero_spatial", 0, cameras=("agentview", "wrist"), image_size=side)

    name = f"LIBERO, {args.libero_envs} envs, {side} px"
    return Case(name, args.libero_envs, side, -1.0, env_fn, 2 * side * side * 3, args.libero_steps)


def _parse(text: str, parts: int) -> list[float]:
    values = [float(v) for v in text.lower().split("x")]
    if len(values) != parts:
        raise ValueError(f"expected {parts} numbers joined by 'x', got {text!r}")
    return values


# ----------------------------------------------------------------------------- time


def measure_time(args: Args) -> dict[str, Any] | None:
    """Where a frame's time goes in ours on ``args.profile_case`` (see the module doc)."""
    if not args.profile_case:
        return None
    num_envs, side = (int(v) for v in _parse(args.profile_case, 2))
    case = camera_case(args, num_envs, side, 0.0, args.profile_steps)
    out: dict[str, Any] = {"case": case.name, "frame_bytes_per_env_step": case.frame_bytes}
    for key, copy in (("ring", True), ("copy", True), ("no_copy", False)):
        envs = PipelinedVectorEnv([case.env_fn] * num_envs, copy=copy, profile=True)
        if key == "copy":
            _without_ring(envs)
        try:
            actions = np.zeros((num_envs, 7), np.float32)
            envs.reset(seed=args.seed)
            for _ in range(args.warmup):
                envs.step(actions)
            envs.profiler.clear()
            start = time.perf_counter()
            for _ in range(case.steps):
                envs.step(actions)
            wall = time.perf_counter() - start
            records = envs.profiler.records()
            workers = len(envs.workers)
        finally:
            envs.close()
        steps = [c for c in records["commands"] if c[1] == "step" and c[3] is not None]
        copies = [s for s in records["spans"] if s[0] == "observation copy"]
        copy_us = sum(s[4] - s[3] for s in copies) / 1e3 / case.steps
        batch_bytes = num_envs * case.frame_bytes
        out[key] = {
            "workers": workers,
            "wall_us_per_step": wall / case.steps * 1e6,
            "worker_step_us": statistics.median((c[4] - c[3]) / 1e3 for c in steps),
            "send_to_start_us": statistics.median((c[3] - c[2]) / 1e3 for c in steps),
            "finish_to_received_us": statistics.median((c[5] - c[4]) / 1e3 for c in steps),
            "caller_copy_us_per_step": copy_us,
            "caller_copies_per_step": len(copies) / case.steps,
            "caller_copy_gb_per_s": batch_bytes / (copy_us * 1e3) if copy_us else None,
        }
    out["writes"] = measure_writes(case, num_envs // max(1, out["copy"]["workers"]), args)
    out["caller_copy"] = measure_caller_copy(case, num_envs, args)
    return out


def measure_caller_copy(case: Case, num_envs: int, args: Args) -> dict[str, Any]:
    """The caller's copy of a batch of frames into new memory (``np.empty`` per copy,
    the previous copy freed only once the next is made, as ``obs = envs.step(...)`` frees
    it) against into a batch allocated once (a reused batch), interleaved, in this
    process."""
    side = case.side
    source = np.random.default_rng(0).integers(
        0, 256, (args.cameras, num_envs, side, side, 3), dtype=np.uint8
    )
    kept = np.empty_like(source)
    previous: list[Any] = [None]

    def new() -> None:
        copies = [np.empty_like(camera) for camera in source]
        for out, camera in zip(copies, source, strict=True):
            out[:] = camera
        previous[0] = copies  # the caller's variable lets the previous copy go now

    def reused() -> None:
        for out, camera in zip(kept, source, strict=True):
            out[:] = camera

    times: dict[str, list[float]] = {"new_batch": [], "kept_batch": []}
    for _ in range(max(3, args.rounds) * 10):
        for name, fn in (("new_batch", new), ("kept_batch", reused)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {
        "envs": num_envs,
        **{f"{k}_us": statistics.median(v) * 1e6 for k, v in times.items()},
        **{f"{k}_gb_per_s": source.nbytes / statistics.median(v) / 1e9 for k, v in times.items()},
    }


def measure_writes(case: Case, envs: int, args: Args) -> dict[str, Any]:
    """A worker's write of ``envs`` envs' frames into shared buffers: gymnasium's
    ``write_to_shared_memory`` against `RowWriter`, interleaved, in this process."""
    from gymnasium.vector.utils import write_to_shared_memory

    from pipelined_vec_env.shared_memory import RowWriter, create_observation_buffers, release

    env = case.env_fn()
    obs, _ = env.reset(seed=args.seed)
    space = env.observation_space
    created = create_observation_buffers(space, envs)
    assert created is not None
    buffers, segments = created
    writer = RowWriter(space, buffers, envs)

    def gymnasium_write() -> None:
        for g in range(envs):
            write_to_shared_memory(space, g, obs, buffers)

    def row_write() -> None:
        for g in range(envs):
            writer.write(g, obs)

    times: dict[str, list[float]] = {"gymnasium": [], "row_writer": []}
    try:
        for _ in range(max(3, args.rounds) * 10):
            for name, fn in (("gymnasium", gymnasium_write), ("row_writer", row_write)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    finally:
        writer.views = None  # its views, before the segments go
        release(segments)
    nbytes = envs * case.frame_bytes
    return {
        "envs": envs,
        **{f"{k}_us": statistics.median(v) * 1e6 for k, v in times.items()},
        **{f"{k}_gb_per_s": nbytes / statistics.median(v) / 1e9 for k, v in times.items()},
    }


# ----------------------------------------------------------------------------- output


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each measured, met or not (None where its case was not run)."""

    def row(case: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
        if case is None:
            return None
        return next((r for r in case["rows"] if r["name"] == name), None)

    cases = result["cases"]
    plain = next(
        (c for c in cases if c["num_envs"] == 32 and c["side"] == 224 and not c["cpu_ms"]), None
    )
    busy = next((c for c in cases if c["cpu_ms"] and c["cpu_ms"] > 0), None)
    checks = [
        (
            "32 envs, 224 px, no env cost: ours step vs Sync",
            row(plain, "ours step"),
            "vs_sync",
            1.5,
        ),
        (
            "32 envs, 224 px, no env cost: ours copy=False vs Sync",
            row(plain, "ours step copy=False"),
            "vs_sync",
            2.0,
        ),
        (
            f"{busy['case'] if busy else 'CPU-cost case'}: ours step vs parallel ceiling",
            row(busy, "ours step"),
            "vs_ceiling",
            0.9,
        ),
    ]
    out = []
    for name, r, key, target in checks:
        measured = None if r is None else r.get(key)
        met = None if measured is None else measured >= target
        out.append({"target": name, "at_least": target, "measured": measured, "met": met})
    return out


def _f(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def format_table(result: dict[str, Any]) -> str:
    """The frames table: per case and backend, env steps/s, GB/s of frames delivered, the
    share of the one-copy limit and the ratio to Sync (and to the parallel ceiling)."""
    lines = [
        "| case | backend | env steps/s | frames GB/s | share of limit | vs Sync | vs ceiling |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in result["cases"]:
        for r in case["rows"]:
            lines.append(
                f"| {case['case']} | {r['name']} "
                f"| {_f(r['steps_per_s'], '.0f' if r['steps_per_s'] >= 100 else '.1f')} "
                f"| {_f(r['frames_gb_per_s'], '.2f')} | {_f(r['share_of_limit'], '.2f')} "
                f"| {_f(r['vs_sync'], '.2f')} | {_f(r['vs_ceiling'], '.2f')} |"
            )
    return "\n".join(lines)


def format_time(result: dict[str, Any]) -> str:
    """Where a frame's time goes (ours, profiled), and the workers' write of frames."""
    time_ = result.get("where_time_goes")
    if not time_:
        return ""
    lines = [
        f"{time_['case']}, ours `step`, per vector step (microseconds; wall: the mean, the"
        " rest medians; the caller's copies: their time per step, and how many):",
        "",
        "| copy | workers | wall | worker step (env steps + frame writes) | send to start "
        "| finish to received | caller's copies | caller copy GB/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    labels = (("ring", "True"), ("copy", "True, no ring"), ("no_copy", "False"))
    for key, label in labels:
        if key not in time_:
            continue
        t = time_[key]
        lines.append(
            f"| {label} | {t['workers']} | {t['wall_us_per_step']:.0f} | {t['worker_step_us']:.0f} "
            f"| {t['send_to_start_us']:.0f} | {t['finish_to_received_us']:.0f} "
            f"| {t['caller_copy_us_per_step']:.0f} ({t['caller_copies_per_step']:.1f} copies) "
            f"| {_f(t['caller_copy_gb_per_s'], '.1f')} |"
        )
    w = time_["writes"]
    lines += [
        "",
        f"One worker's write of {w['envs']} envs' frames into shared memory, in one process: "
        f"gymnasium's `write_to_shared_memory` {w['gymnasium_us']:.0f} us "
        f"({w['gymnasium_gb_per_s']:.1f} GB/s), `RowWriter` {w['row_writer_us']:.0f} us "
        f"({w['row_writer_gb_per_s']:.1f} GB/s).",
    ]
    c = time_.get("caller_copy")
    if c:
        lines.append(
            f"The caller's copy of {c['envs']} envs' frames, in one process: into new memory "
            f"{c['new_batch_us']:.0f} us ({c['new_batch_gb_per_s']:.1f} GB/s), into a batch "
            f"allocated once {c['kept_batch_us']:.0f} us ({c['kept_batch_gb_per_s']:.1f} GB/s)."
        )
    return "\n".join(lines)


def format_targets(result: dict[str, Any]) -> str:
    """The targets, measured, met or not."""
    lines = ["| target | at least | measured | met |", "| --- | --- | --- | --- |"]
    for t in result["targets"]:
        met = "" if t["met"] is None else ("met" if t["met"] else "not met")
        lines.append(f"| {t['target']} | {t['at_least']} | {_f(t['measured'], '.2f')} | {met} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = tyro.cli(Args, args=argv)
    started, load = time.time(), (__import__("os").getloadavg()[0])
    cases = [camera_case(args, n, side, 0.0, args.steps) for n in args.envs for side in args.sides]
    for text in args.cpu_cases:
        n, side, ms = _parse(text, 3)
        cases.append(camera_case(args, int(n), int(side), ms, args.cpu_steps))
    measured = [measure_case(case, args) for case in cases]
    if args.libero:
        measured.append(measure_case(libero_case(args), args, one_at_a_time=True))
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in asdict(args).items()},
        "cases": measured,
    }
    result["where_time_goes"] = measure_time(args)
    result["targets"] = targets(result)
    packages = ("numpy", "gymnasium", "stable-baselines3", "torch")
    result["run"] = run_record(REPO, started, load, packages)
    text = "\n\n".join(
        part for part in (format_table(result), format_time(result), format_targets(result)) if part
    )
    write_results(args.output, result, text)
    return result


if __name__ == "__main__":
    main()
