"""Stable-Baselines3 PPO wall-clock: ``SubprocVecEnv`` next to the ``SB3VecEnv`` adapter.

Backends: ``SubprocVecEnv`` (one process per env), the adapter with default arguments
(``SB3VecEnv(fns)``, the layout the vector env picks for the machine), the adapter with
each explicit ``--envs-per-worker``, and SB3's in-process ``DummyVecEnv``.

Every backend trains the same PPO (same hyperparameters, seeds and env fns) for the same
number of env steps on a MuJoCo task (``HalfCheetah-v5`` by default), in one run. Runs
are interleaved in rounds (each round visits every backend once) so drift on a shared
machine spreads over all of them; the table shows medians over rounds.

Per backend: wall time of ``model.learn`` (start-up of the workers excluded and shown
apart), the part of it spent collecting rollouts (env steps plus policy inference) and
the part spent in gradient updates, env steps per second, and a checksum of the final
policy parameters. The adapter returns exactly what ``SubprocVecEnv`` returns, so the
checksums of all subprocess backends must agree: the same training, only faster or
slower.

Run::

    python benchmarks/sb3_ppo.py                      # default, < 3 minutes on 2 cores
    python benchmarks/sb3_ppo.py --total-timesteps 65536 --num-envs 8 --rounds 3
    python benchmarks/sb3_ppo.py --envs-per-worker 1 2   # explicit layouts beside the default

Results: ``benchmarks/results/sb3_ppo.json`` and ``benchmarks/results/sb3_ppo.md``.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import machine_identity, package_versions, write_results  # noqa: E402

# torch and SB3 are imported inside functions: the workers (forkserver) import this
# module as their ``__main__`` and need neither.

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Args:
    env_id: str = "HalfCheetah-v5"
    """gymnasium id of the task"""
    num_envs: int = 4
    """envs (SubprocVecEnv: one process each)"""
    total_timesteps: int = 16_384
    """env steps per PPO run"""
    n_steps: int = 256
    """PPO rollout length per env"""
    batch_size: int = 256
    """PPO minibatch size"""
    n_epochs: int = 4
    """PPO epochs per rollout"""
    rounds: int = 2
    """runs per backend (interleaved); the table shows medians"""
    default_adapter: bool = True
    """measure the adapter with default arguments (``SB3VecEnv(fns)``: the layout
    `default_envs_per_worker` picks for this machine)"""
    envs_per_worker: tuple[int, ...] = ()
    """adapter configurations with an explicit ``envs_per_worker`` to measure, one row each"""
    include_dummy: bool = True
    """also measure SB3's in-process DummyVecEnv (no subprocesses) as a reference"""
    seed: int = 0
    """seed of PPO and of the envs"""
    output: Path = RESULTS / "sb3_ppo.json"
    """JSON results; the markdown table goes next to it (.md)"""


def make_backends(args: Args) -> dict[str, Any]:
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from pipelined_vec_env.sb3 import SB3VecEnv

    env_id = args.env_id

    def fns() -> list:
        return [lambda: gym.make(env_id) for _ in range(args.num_envs)]

    backends: dict[str, Any] = {"SubprocVecEnv": lambda: SubprocVecEnv(fns())}
    if args.default_adapter:
        backends["SB3VecEnv(fns) (default arguments)"] = lambda: SB3VecEnv(fns())
    for epw in args.envs_per_worker:
        backends[f"SB3VecEnv(envs_per_worker={epw})"] = lambda epw=epw: SB3VecEnv(
            fns(), envs_per_worker=epw
        )
    if args.include_dummy:
        backends["DummyVecEnv (in-process)"] = lambda: DummyVecEnv(fns())
    return backends


def run_once(make_venv: Any, args: Args) -> dict[str, float]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutTimer(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.rollout_s = 0.0
            self._start = 0.0

        def _on_rollout_start(self) -> None:
            self._start = time.perf_counter()

        def _on_rollout_end(self) -> None:
            self.rollout_s += time.perf_counter() - self._start

        def _on_step(self) -> bool:
            return True

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    venv = make_venv()
    startup_s = time.perf_counter() - t0
    try:
        venv.seed(args.seed)
        model = PPO(
            "MlpPolicy",
            venv,
            n_steps=args.n_steps,
            batch_size=args.batch_size,
            n_epochs=args.n_epochs,
            seed=args.seed,
            device="cpu",
        )
        timer = RolloutTimer()
        t0 = time.perf_counter()
        model.learn(args.total_timesteps, callback=timer)
        learn_s = time.perf_counter() - t0
        checksum = float(sum(p.detach().double().abs().sum() for p in model.policy.parameters()))
    finally:
        venv.close()
    return {
        "startup_s": startup_s,
        "learn_s": learn_s,
        "rollout_s": timer.rollout_s,
        "train_s": learn_s - timer.rollout_s,
        "steps": float(model.num_timesteps),
        "param_checksum": checksum,
    }


def machine() -> dict[str, Any]:
    versions = package_versions(("gymnasium", "stable_baselines3", "torch", "mujoco", "numpy"))
    return {
        **machine_identity(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus_usable": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "versions": versions,
    }


def table(rows: list[dict[str, Any]], args: Args) -> str:
    base = next(r for r in rows if r["backend"] == "SubprocVecEnv")["learn_s"]
    lines = [
        f"SB3 PPO on {args.env_id}, {args.num_envs} envs, {args.total_timesteps} steps "
        f"(n_steps={args.n_steps}, batch_size={args.batch_size}, n_epochs={args.n_epochs}), "
        f"median of {args.rounds} rounds",
        "",
        "| backend | learn (s) | rollout (s) | train (s) | steps/s | vs SubprocVecEnv | start-up (s) | param checksum |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['learn_s']:.1f} | {r['rollout_s']:.1f} | {r['train_s']:.1f} | "
            f"{r['steps'] / r['learn_s']:.0f} | {base / r['learn_s']:.2f}x | {r['startup_s']:.1f} | "
            f"{r['param_checksum']:.6f} |"
        )
    return "\n".join(lines)


def results_table(result: dict[str, Any]) -> str:
    """`table` of a result file (the whole JSON, whose ``args`` are strings)."""
    return table(result["rows"], SimpleNamespace(**result["args"]))  # type: ignore[arg-type]


def main(args: Args) -> dict[str, Any]:
    backends = make_backends(args)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in backends}
    for round_index in range(args.rounds):
        for name, make_venv in backends.items():
            result = run_once(make_venv, args)
            runs[name].append(result)
            print(f"round {round_index}: {name}: learn {result['learn_s']:.1f} s", flush=True)
    rows = []
    for name, results in runs.items():
        row: dict[str, Any] = {"backend": name}
        for key in results[0]:
            row[key] = statistics.median(r[key] for r in results)
        row["runs"] = results
        rows.append(row)
    report = {
        "args": {k: str(v) for k, v in asdict(args).items()},
        "machine": machine(),
        "rows": rows,
    }
    write_results(args.output, report, table(rows, args))
    return report


if __name__ == "__main__":
    main(tyro.cli(Args))
