"""The warm start of the LIBERO main job: a scripted expert's demos of every task, then
behaviour cloning (BC) of the PPO actor on them.

The expert acts on privileged sim state (`reference_trainer.libero_tasks.expert_for`);
the actor clones it on the observation the policy gets (goal features by default).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from reference_trainer.layout import fixed_num_stages
from reference_trainer.libero_tasks import TASK_ONE_HOT_KEY, expert_for

__all__ = ["check_expert", "clone_demos", "collect_demos", "warm_start"]

logger = logging.getLogger(__name__)


def obs_keys(config: Any) -> tuple[str, ...]:
    """The observation keys the actor reads: --state-features, then the one-hot."""
    keys = {"goal": ("goal_features",), "full": ("state",), "both": ("goal_features", "state")}
    one_hot = (TASK_ONE_HOT_KEY,) if config.task_one_hot else ()
    return keys[config.state_features] + one_hot


def check_expert(config: Any, tasks: list[int]) -> None:
    """Raise ValueError naming --suite if a task of the run has no scripted expert (the
    demos need one; --from-scratch does not)."""
    if config.from_scratch:
        return
    try:
        for task in tasks:
            expert_for(config.suite, task)
    except ValueError as err:
        raise ValueError(
            f"--suite {config.suite}: the demos need a scripted expert ({err}); "
            "--from-scratch needs none"
        ) from None


def collect_demos(config: Any, tasks: list[int], run_dir: Path) -> dict[str, Any]:
    """The expert's demos of every task, written to ``demos.hdf5``; their summary."""
    from pipelined_vec_env.libero.demos import write_demos
    from reference_trainer.libero_tasks import add_task_one_hot, collect_suite_demos

    t0 = time.perf_counter()
    ids = config.init_states("demo")
    logger.info(
        "collecting expert demos: %d tasks x %d init states (%s), one env per task",
        len(tasks),
        len(ids),
        f"{ids[0]}-{ids[-1]}",
    )
    demos = collect_suite_demos(
        config.suite,
        tasks,
        ids,
        noise_std=config.demo_noise_std,
        num_workers=fixed_num_stages(config),
        seed=config.seed,
    )
    if config.task_one_hot:
        add_task_one_hot(demos, tasks)
    path = run_dir / "demos.hdf5"
    write_demos(path, demos)
    info = demos.attrs["collection"]
    wall_s = time.perf_counter() - t0
    logger.info(
        "%d demos (%d/%d expert successes) in %.0f s",
        len(demos),
        len(demos),
        info["attempts"],
        wall_s,
    )
    return {
        "path": str(path),
        "kept": len(demos),
        "expert_successes": info["successes"],
        "expert_successes_per_task": info["successes_per_task"],
        "attempts": info["attempts"],
        "steps": demos.num_samples,
        "noise_std": config.demo_noise_std,
        "wall_s": wall_s,
    }


def clone_demos(
    config: Any, run_dir: Path, name: str, **limits: Any
) -> tuple[dict[str, Any], list[list[float]]]:
    """BC of the actor on ``demos.hdf5`` into ``<name>.pt``; its metrics (with the
    checkpoint and wall time) and its curve (``[epoch, train_mse, heldout_mse]`` per epoch)."""
    from reference_trainer.bc import BCConfig, train_bc

    t0 = time.perf_counter()
    bc = train_bc(
        BCConfig(
            demos=str(run_dir / "demos.hdf5"),
            output=str(run_dir / f"{name}.pt"),
            obs_keys=obs_keys(config),
            chunk_size=config.chunk_size,
            hidden_sizes=tuple(config.hidden_sizes),
            heldout=config.bc_heldout,
            seed=config.seed,
            torch_threads=1,
            **limits,
        )
    )
    metrics = {**bc.metrics, "checkpoint": bc.checkpoint, "wall_s": time.perf_counter() - t0}
    return metrics, [list(point) for point in bc.curve]


def warm_start(config: Any, tasks: list[int], run_dir: Path) -> dict[str, Any]:
    """Collect the expert demos and clone them; return what the summary records."""
    demos = collect_demos(config, tasks, run_dir)
    bc, curve = clone_demos(
        config, run_dir, "bc", max_epochs=config.bc_max_epochs, patience=config.bc_patience
    )
    return {"demos": demos, "bc": bc, "bc_curve": curve}
