"""The control of the fine-tuning (``--bc-control``): the same demos and evaluations, but
the minutes RL would get go to a longer BC run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from reference_trainer.budget import FINISH_MARGIN_S, eval_estimate, video_estimate
from reference_trainer.checkpoint_evaluation import evaluate_checkpoint
from reference_trainer.envs import EnvFactory
from reference_trainer.progress_bar import TrainingBar
from reference_trainer.warm_start import clone_demos

__all__ = ["bc_control"]


def bc_control(
    config: Any, factory: EnvFactory, run_dir: Path, progress: TrainingBar | None = None
) -> dict[str, Any]:
    """Evaluate the BC policy, train BC again for the minutes RL would get (until
    ``config.deadline``, less the evaluation after it), evaluate (with the video the RL
    run's final evaluation records); the longer BC's per-epoch errors go to
    ``curves.json`` (``bc_long_curve``). ``progress``: the job's bar, labelled with each
    step."""
    t0 = time.time()
    deadline = config.deadline
    if progress is not None:
        progress.describe("eval before longer BC")
    before = evaluate_checkpoint(config, factory, str(config.init_checkpoint))
    before["bc_minutes"] = 0.0
    # the evaluation after BC (its video included) is planned as the trainer plans its final one
    after_s = eval_estimate([before], int(before["episodes"]), config.num_envs, 0, None)
    after_s += video_estimate([before], config)
    left = 0.0 if deadline is None else deadline - time.time() - after_s - FINISH_MARGIN_S
    minutes = max(0.1, left / 60)
    if progress is not None:
        progress.describe("longer BC")
    bc, curve = clone_demos(
        config, run_dir, "bc_long", max_epochs=10**9, patience=10**9, max_minutes=minutes
    )
    video = run_dir / "videos" / "after.mp4" if config.eval_video else None
    if progress is not None:
        progress.describe("final evaluation")
    after = evaluate_checkpoint(config, factory, bc["checkpoint"], video=video)
    after["label"] = "after longer BC"
    after["bc_minutes"] = minutes
    return {
        "eval_success_rate_initial": before["success_rate"],
        "eval_success_rate_final": after["success_rate"],
        "eval_episodes": int(after["episodes"]),
        "evaluations": [before, after],
        "final_eval": after,
        "bc_long_curve": curve,
        "bc_long": {**bc, "minutes": minutes},
        "global_step": 0,
        "wall_s": time.time() - t0,
    }
