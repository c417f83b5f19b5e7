"""Round-trip overhead of ``backend="ray"`` next to ``backend="multiprocessing"``, one machine.

Both backends step the same null env (``step`` does nothing and returns a fixed
observation), so the time per vector ``step()`` is pure framework cost: multiprocessing
sends actions through a pipe and observations through shared memory; Ray submits one actor
call per worker and gets observations back through its object store. Measured for a few
layouts (envs, workers) and observation sizes (a small state vector, an 84x84 RGB image, a
1 MiB frame). Each round builds, warms up, times and closes every entry in turn, so drift
in the machine's load spreads over all of them; the table shows medians over rounds.

Also reported: how long building each vector env takes (process or actor start-up) and
how long ``ray.init`` of a local instance takes.

Run::

    python benchmarks/ray_overhead.py                 # about a minute on 2 idle cores
    python benchmarks/ray_overhead.py --steps 2000 --rounds 5

Results go to ``benchmarks/results/ray_overhead.json`` with the machine's description.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import tyro
from gymnasium import spaces

from pipelined_vec_env import PipelinedVectorEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import machine_identity, package_versions, relative_paths  # noqa: E402

logger = logging.getLogger("ray_overhead")

# Imported as a module (not run as a script), workers cannot import it by name: ship its
# env class to them by value.
if __name__ != "__main__":
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

RESULTS = Path(__file__).resolve().parent / "results" / "ray_overhead.json"

#: Observation sizes: name -> (shape, dtype).
OBS = {
    "state16": ((16,), np.float32),
    "rgb84": ((84, 84, 3), np.uint8),
    "frame1MiB": ((512, 512, 4), np.uint8),
}


@dataclass
class Args:
    """Ray overhead benchmark options."""

    steps: int = 300
    """Vector steps timed per entry and round."""
    warmup: int = 20
    """Vector steps run before timing starts."""
    rounds: int = 3
    """Rounds; medians over rounds are reported."""
    layouts: tuple[str, ...] = ("1x1", "2x1", "8x4")
    """Layouts as ``ENVSxENVS_PER_WORKER`` (workers = envs / envs_per_worker), one stage."""
    obs: tuple[str, ...] = ("state16", "rgb84", "frame1MiB")
    """Observation sizes to measure (see ``OBS``)."""
    ray_num_cpus: float = 0.25
    """CPUs each Ray actor reserves (fractional so every layout fits on 2 cores)."""
    output: Path = RESULTS
    """Where the JSON results go."""


class NullEnv(gym.Env):
    """An env whose ``step`` does nothing and returns a fixed observation.

    Args:
        shape: Observation shape.
        dtype: Observation dtype.
    """

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        high = 255 if np.dtype(dtype) == np.uint8 else 1.0
        self.observation_space = spaces.Box(0, high, shape=shape, dtype=dtype)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self._obs = np.zeros(shape, dtype=dtype)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return self._obs, {}

    def step(self, action: Any):
        return self._obs, 0.0, False, False, {}


def _build(backend: str, layout: str, obs: str, ray_num_cpus: float) -> PipelinedVectorEnv:
    num_envs, per_worker = (int(x) for x in layout.split("x"))
    shape, dtype = OBS[obs]
    fns = [lambda: NullEnv(shape, dtype) for _ in range(num_envs)]
    kwargs: dict[str, Any] = {"envs_per_worker": per_worker}
    if backend == "ray":
        kwargs.update(backend="ray", ray_options={"num_cpus": ray_num_cpus})
    return PipelinedVectorEnv(fns, **kwargs)


def _time_steps(envs: PipelinedVectorEnv, steps: int, warmup: int) -> float:
    """Mean microseconds per vector step over ``steps`` steps, after ``warmup`` steps."""
    actions = np.zeros((envs.num_envs, 1), dtype=np.float32)
    envs.reset(seed=0)
    for _ in range(warmup):
        envs.step(actions)
    start = time.perf_counter()
    for _ in range(steps):
        envs.step(actions)
    return (time.perf_counter() - start) / steps * 1e6


def machine_info() -> dict[str, Any]:
    """The machine, Python and package versions, and the load average."""

    versions = package_versions(("ray", "gymnasium", "numpy"))
    return {
        **machine_identity(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        **versions,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table, and write the JSON results.

    Returns:
        The results written to ``args.output``.
    """
    import ray

    args = tyro.cli(Args, args=argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ray_init_s = time.perf_counter() - start
    entries = [(o, layout) for o in args.obs for layout in args.layouts]
    us: dict[tuple[str, str, str], list[float]] = {}
    build_s: dict[tuple[str, str, str], list[float]] = {}
    machine_start = machine_info()
    try:
        for r in range(args.rounds):
            for obs, layout in entries:
                for backend in ("multiprocessing", "ray"):
                    key = (backend, layout, obs)
                    t0 = time.perf_counter()
                    envs = _build(backend, layout, obs, args.ray_num_cpus)
                    build_s.setdefault(key, []).append(time.perf_counter() - t0)
                    try:
                        us.setdefault(key, []).append(_time_steps(envs, args.steps, args.warmup))
                    finally:
                        envs.close()
            logger.info("round %d of %d done", r + 1, args.rounds)
    finally:
        if own_ray:
            ray.shutdown()

    rows = []
    for obs, layout in entries:
        mp_us = statistics.median(us[("multiprocessing", layout, obs)])
        ray_us = statistics.median(us[("ray", layout, obs)])
        num_envs, per_worker = (int(x) for x in layout.split("x"))
        rows.append(
            {
                "obs": obs,
                "obs_bytes": int(np.prod(OBS[obs][0]) * np.dtype(OBS[obs][1]).itemsize),
                "num_envs": num_envs,
                "workers": num_envs // per_worker,
                "multiprocessing_us_per_step": round(mp_us, 1),
                "ray_us_per_step": round(ray_us, 1),
                "ray_extra_us_per_step": round(ray_us - mp_us, 1),
                "ray_over_mp": round(ray_us / mp_us, 2),
                "multiprocessing_build_s": round(
                    statistics.median(build_s[("multiprocessing", layout, obs)]), 2
                ),
                "ray_build_s": round(statistics.median(build_s[("ray", layout, obs)]), 2),
            }
        )
    header = f"{'obs':>10} {'envs':>4} {'wrk':>3} {'mp us':>9} {'ray us':>9} {'ray/mp':>6} {'build mp s':>10} {'build ray s':>11}"
    lines = [header] + [
        f"{r['obs']:>10} {r['num_envs']:>4} {r['workers']:>3} {r['multiprocessing_us_per_step']:>9.1f} "
        f"{r['ray_us_per_step']:>9.1f} {r['ray_over_mp']:>6.2f} {r['multiprocessing_build_s']:>10.2f} "
        f"{r['ray_build_s']:>11.2f}"
        for r in rows
    ]
    logger.info(
        "microseconds per vector step (median of %d rounds):\n%s", args.rounds, "\n".join(lines)
    )
    if own_ray:
        logger.info("ray.init (local instance): %.1f s", ray_init_s)
    result = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
        "machine_start": machine_start,
        "machine_end": machine_info(),
        "ray_init_s": round(ray_init_s, 2) if own_ray else None,
        "rows": rows,
        "samples_us": {"/".join(k): [round(x, 1) for x in v] for k, v in us.items()},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(relative_paths(result), indent=2) + "\n")
    logger.info("wrote %s", args.output)
    return result


if __name__ == "__main__":
    main()
