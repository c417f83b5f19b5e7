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
(``--worker-nice 0`` to compare).

Usage::

    python benchmarks/rollout_overlap.py                     # CPU, writes results JSON
    python benchmarks/rollout_overlap.py --device cuda --hidden-sizes 2048 2048 2048
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import tyro
from gymnasium.vector import AutoresetMode

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.debug_envs import BusyEnv
from reference_trainer.agent import ActorCritic, obs_to_tensor
from reference_trainer.envs import NicedEnvFn
from reference_trainer.metrics import ideal_pipelined_fraction
from reference_trainer.rollout import RolloutCollector


@dataclass
class Args:
    """Rollout overlap benchmark."""

    num_envs: int = 8
    """Envs (one per worker)."""
    step_ms: float = 10.0
    """CPU time per env step in milliseconds (LIBERO state-only: ~10 ms)."""
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
    """Nice value of the env workers: 10 lets the trainer's inference preempt the
    simulators (on a CPU-only machine they share cores); 0 leaves priorities alone."""
    num_steps: int = 24
    """Decisions per env per measured rollout."""
    repeats: int = 5
    """Measured rollouts per configuration (the median is reported)."""
    output: str | None = None
    """JSON output path (default benchmarks/results/rollout_overlap_<device>.json)."""


def _make_env(step_seconds: float, obs_dim: int) -> BusyEnv:
    return BusyEnv(step_seconds=step_seconds, obs_dim=obs_dim, action_dim=7, episode_length=10_000)


def _envs(args: Args, num_stages: int) -> PipelinedVectorEnv:
    fn = NicedEnvFn(
        functools.partial(_make_env, args.step_ms / 1000.0, args.obs_dim), args.worker_nice
    )
    return PipelinedVectorEnv(
        [fn] * args.num_envs, num_stages=num_stages, autoreset_mode=AutoresetMode.SAME_STEP
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


def run(args: Args) -> dict:
    """Run every configuration and return the results (also printed as a table).

    Configurations are measured interleaved (serial, 1, 2, 4 stages, serial, ...) so that
    a change in the machine's load during the run affects all of them alike.
    """
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
        "machine": {
            "cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name(0)
            if device.type == "cuda"
            else platform.processor(),
            "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        },
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


def main() -> None:
    """CLI entry point."""
    args = tyro.cli(Args)
    result = run(args)
    _print_table(result)
    out = Path(
        args.output or Path(__file__).parent / "results" / f"rollout_overlap_{args.device}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
