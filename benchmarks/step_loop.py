"""Whole-env ``step()`` of 8 HalfCheetah-v5 envs in 2 workers of 4, for comparing checkouts.

Steps a fixed count of vector steps with pre-drawn random actions and prints the env steps
per second. Run it with ``PYTHONPATH`` pointing at two checkouts in turn (A B A B ...) and
compare whole-process wall times or the printed rates, e.g. with ``/usr/bin/time``::

    PYTHONPATH=/path/to/old python benchmarks/step_loop.py 3000
    PYTHONPATH=/path/to/new python benchmarks/step_loop.py 3000

Argument: the number of timed vector steps (default 3000; 50 are run before timing).
"""

from __future__ import annotations

import sys
import time

import gymnasium as gym
import numpy as np

import pipelined_vec_env
from pipelined_vec_env import PipelinedVectorEnv


def main(steps: int = 3000) -> float:
    """Env steps per second of ``steps`` timed vector steps (8 envs, 2 workers of 4)."""
    fns = [lambda: gym.make("HalfCheetah-v5") for _ in range(8)]
    envs = PipelinedVectorEnv(fns, envs_per_worker=4)
    actions = np.random.default_rng(0).uniform(-1, 1, size=(64, 8, 6)).astype(np.float32)
    try:
        envs.reset(seed=0)
        for i in range(50):
            envs.step(actions[i % 64])
        start = time.perf_counter()
        for i in range(steps):
            envs.step(actions[i % 64])
        rate = steps * 8 / (time.perf_counter() - start)
    finally:
        envs.close()
    print(f"{pipelined_vec_env.__file__}: {rate:.0f} env steps/s")
    return rate


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
