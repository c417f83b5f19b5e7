"""Stages and decoupled mode with a device policy whose inference takes as long as the envs.

The VLA case: a CPU-bound simulator (``BusyEnv``, ~15 ms of CPU per step, one env per
worker) and a policy on the GPU whose inference for all envs takes about as long as one env
step (``Ti ~ Te``). Then the serial loop costs ``Te + Ti`` per round and an ideal pipeline
``max(Te, Ti)`` (design notes), about half. Measured, interleaved over rounds:

- ``serial``: ``infer(all); step(all)``;
- ``stages=K`` (1, 2, 4): inference of stage ``s`` while the other stages step
  (``step_async``/``step_wait`` per stage, round robin);
- ``decoupled``: ``recv`` half of the envs, infer, ``send``, EnvPool style (envs
  received beyond the batch wait for the next inference).

Each configuration runs with ``profile=True`` and records the profiler's summary
(bottleneck, busy fractions, predicted speed-ups) next to the measured time per round and
the bound. The policy's cost is linear in the batch (one calibrated block of matrix
products per env row), as a large model's is once the batch fills the device, so a stage's
inference takes ``Ti * stage_size / num_envs``.

Without CUDA it falls back to the CPU (``--device auto``), where the policy competes with
the simulators for cores and the bound is optimistic; use it to check the script, not to
judge the pipeline. Needs only numpy, gymnasium, cloudpickle, threadpoolctl, torch and
this package (no tyro), so the wheels to carry to a bare GPU machine stay small.

Run::

    python benchmarks/gpu_stages.py                       # cuda if available, else cpu
    python benchmarks/gpu_stages.py --rounds 3 --decisions 20 --env-seconds 0.015
    python benchmarks/gpu_stages.py --device cpu --num-envs 4 --decisions 8 --rounds 1

Results go to ``benchmarks/results/gpu_stages_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.debug_envs import BusyEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import relative_paths, run_record  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto, cuda or cpu")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--env-seconds", type=float, default=0.015, help="CPU time per env step")
    p.add_argument("--policy-ratio", type=float, default=1.0, help="Ti / Te for all envs")
    p.add_argument("--decisions", type=int, default=30, help="decisions per env per measurement")
    p.add_argument("--rounds", type=int, default=3, help="interleaved repetitions")
    p.add_argument("--stages", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--width", type=int, default=1024, help="matrix size of the policy's work")
    p.add_argument("--tokens", type=int, default=256, help="rows per env in the policy's work")
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


class LinearCostPolicy:
    """Actions from observations at a calibrated cost per env row on ``device``.

    Each env row becomes ``tokens`` rows of width ``width`` (as a VLA's observation becomes
    many tokens), pushed through ``repeats`` ``width x width`` products: with enough rows
    per call the device is compute-bound, so the cost grows with the batch (checked by
    ``calibrate``). The action is a fixed projection of the observation.
    """

    def __init__(
        self, device: torch.device, width: int, obs_dim: int, action_dim: int, tokens: int = 256
    ) -> None:
        self.device = device
        self.tokens = tokens
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.weight = (torch.randn(width, width, generator=gen) / width**0.5).to(device)
        self.head = (torch.randn(obs_dim, action_dim, generator=gen) * 0.1).to(device)
        self.repeats = 1

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(obs, device=self.device, dtype=torch.float32)
        h = torch.ones(x.shape[0] * self.tokens, self.weight.shape[0], device=self.device)
        for _ in range(self.repeats):
            h = torch.tanh(h @ self.weight)
        per_env = h.view(x.shape[0], self.tokens, -1)[:, 0, : self.head.shape[1]]
        out = torch.tanh(x @ self.head + 0.0 * per_env)
        return out.cpu().numpy()  # waits for the device

    def time_batch(self, rows: int) -> float:
        """Median seconds of one call on ``rows`` env rows."""
        obs = np.zeros((rows, self.head.shape[0]), dtype=np.float32)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            self(obs)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def calibrate(self, rows: int, seconds: float) -> float:
        """Set ``repeats`` so that a batch of ``rows`` takes about ``seconds``; return the
        measured time of that batch."""
        obs = np.zeros((rows, self.head.shape[0]), dtype=np.float32)
        self.repeats = 8
        for _ in range(3):
            self(obs)  # warm up (kernels, allocator)
        t0 = time.perf_counter()
        self(obs)
        per_repeat = (time.perf_counter() - t0) / self.repeats
        self.repeats = max(1, round(seconds / max(per_repeat, 1e-9)))
        return self.time_batch(rows)


def _envs(args: argparse.Namespace, num_stages: int) -> PipelinedVectorEnv:
    fn = partial(BusyEnv, step_seconds=args.env_seconds, obs_dim=16, action_dim=7)
    return PipelinedVectorEnv([fn] * args.num_envs, num_stages=num_stages, profile=True)


def run_serial(envs: PipelinedVectorEnv, policy: LinearCostPolicy, decisions: int) -> float:
    obs, _ = envs.reset(seed=0)
    envs.profiler.clear()
    t0 = time.perf_counter()
    for _ in range(decisions):
        with envs.profiler.span("inference"):
            actions = policy(obs)
        obs, *_ = envs.step(actions)
    return (time.perf_counter() - t0) / decisions


def run_staged(envs: PipelinedVectorEnv, policy: LinearCostPolicy, decisions: int) -> float:
    obs, _ = envs.reset(seed=0)
    envs.profiler.clear()
    slices = envs.stage_slices
    t0 = time.perf_counter()
    for s, index in enumerate(slices):
        with envs.profiler.span("inference", stage=s):
            actions = policy(obs[index])
        envs.step_async(actions, stage=s)
    for t in range(decisions):
        for s, _index in enumerate(slices):
            stage_obs, *_ = envs.step_wait(stage=s)
            if t + 1 < decisions:
                with envs.profiler.span("inference", stage=s):
                    actions = policy(stage_obs)
                envs.step_async(actions, stage=s)
    return (time.perf_counter() - t0) / decisions


def run_decoupled(envs: PipelinedVectorEnv, policy: LinearCostPolicy, decisions: int) -> float:
    """EnvPool's loop: infer on ``num_envs // 2`` received envs, send, repeat.

    ``recv`` returns every result that is ready, which may be more than the batch (envs of
    equal step time finish together); the extra envs are held for the next inference, as
    EnvPool's exact batch would leave them, so every inference sees one batch. Timed until
    ``decisions * num_envs`` actions were sent and their results received."""
    n = envs.num_envs
    batch = max(1, n // 2)
    envs.async_reset(seed=0)
    envs.profiler.clear()
    held_ids = np.zeros(0, dtype=np.int64)
    space = envs.single_observation_space
    held_obs = np.zeros((0, *space.shape), dtype=space.dtype)
    target, sent = decisions * n, 0
    t0 = time.perf_counter()
    while sent < target:
        if len(held_ids) < batch:
            obs, _, _, _, infos = envs.recv(batch_size=batch - len(held_ids))
            held_ids = np.concatenate([held_ids, infos["env_id"]])
            held_obs = np.concatenate([held_obs, obs])
        k = min(batch, target - sent)
        with envs.profiler.span("inference"):
            actions = policy(held_obs[:k])
        envs.send(actions, held_ids[:k])
        held_ids, held_obs, sent = held_ids[k:], held_obs[k:], sent + k
    in_flight = n - len(held_ids)
    if in_flight:
        envs.recv(batch_size=in_flight)  # drain: the last sends
    return (time.perf_counter() - t0) / (sent / n)


def _summary_digest(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "bottleneck": summary["bottleneck"],
        "bottleneck_reason": summary["bottleneck_reason"],
        "caller_busy_fraction": summary["caller_busy_fraction"],
        "policy_idle_fraction": summary["policy_idle_fraction"],
        "env_busy_fraction": {k: v["env_busy_fraction"] for k, v in summary["stages"].items()},
        "predicted_speedup": summary["predicted_speedup"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    started, load_start = time.time(), os.getloadavg()[0]
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cpu":
        torch.set_num_threads(1)
        print("no CUDA: the policy runs on the CPU, beside the simulators (bound optimistic)")
    policy = LinearCostPolicy(device, args.width, obs_dim=16, action_dim=7, tokens=args.tokens)

    configs: dict[str, PipelinedVectorEnv] = {"serial": _envs(args, 1)}
    for k in args.stages:
        if k <= args.num_envs:
            configs[f"stages={k}"] = _envs(args, k)
    configs["decoupled"] = _envs(args, 1)
    try:
        envs = configs["serial"]
        obs, _ = envs.reset(seed=0)
        actions = np.zeros((args.num_envs, 7), dtype=np.float32)
        te_times = []
        for _ in range(max(5, args.decisions // 3)):
            t0 = time.perf_counter()
            envs.step(actions)
            te_times.append(time.perf_counter() - t0)
        te = statistics.median(te_times)
        ti = policy.calibrate(args.num_envs, args.policy_ratio * te)
        bound = max(te, ti)
        half = policy.time_batch(max(1, args.num_envs // 2))
        linearity = half / (ti / 2)  # 1.0: half the batch costs half the time
        print(
            f"device {device}: Te {1e3 * te:.2f} ms, Ti {1e3 * ti:.2f} ms per round "
            f"(all {args.num_envs} envs); serial ~{1e3 * (te + ti):.1f} ms, bound {1e3 * bound:.1f} ms; "
            f"half the batch costs {linearity:.2f}x half of Ti"
        )
        runners = {"serial": run_serial, "decoupled": run_decoupled}
        times: dict[str, list[float]] = {c: [] for c in configs}
        digests: dict[str, dict[str, Any]] = {}
        for r in range(args.rounds):
            for cname, envs in configs.items():
                runner = runners.get(cname, run_staged)
                times[cname].append(runner(envs, policy, args.decisions))
                digests[cname] = _summary_digest(envs.profiler.summary())
                print(
                    f"round {r}: {cname:10s} {1e3 * times[cname][-1]:8.2f} ms/round "
                    f"({digests[cname]['bottleneck']})",
                    flush=True,
                )
    finally:
        for envs in configs.values():
            envs.close()

    serial = statistics.median(times["serial"])
    rows = []
    for cname, ts in times.items():
        t = statistics.median(ts)
        rows.append(
            {
                "config": cname,
                "round_ms": 1e3 * t,
                "speedup_vs_serial": serial / t,
                "of_bound": (serial / t) / ((te + ti) / bound),
                "profile": digests[cname],
            }
        )
    print(f"\n{'config':10s} {'ms/round':>9s} {'speed-up':>9s} {'of bound':>9s}  bottleneck")
    for row in rows:
        print(
            f"{row['config']:10s} {row['round_ms']:9.2f} {row['speedup_vs_serial']:9.2f} "
            f"{row['of_bound']:9.2f}  {row['profile']['bottleneck']}"
        )
    print(f"bound: {(te + ti) / bound:.2f}x the serial loop (max(Te, Ti) vs Te + Ti)")
    result = {
        **run_record(REPO, started, load_start, ["torch", "gymnasium", "numpy"]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "device": str(device),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "te_s": te,
        "ti_s": ti,
        "policy_repeats": policy.repeats,
        "policy_half_batch_linearity": linearity,
        "bound_speedup": (te + ti) / bound,
        "rows": rows,
        "python": platform.python_version(),
    }
    output = args.output or RESULTS / f"gpu_stages_{device.type}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(relative_paths(result), indent=2))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
