"""The PPO training loop: rollout, advantages, update, self-imitation, logging,
checkpoint, evaluation.

Run it on any gymnasium id:

    python -m reference_trainer.train --env-id InvertedPendulum-v5 --total-timesteps 200000

A run directory holds ``config.json``, TensorBoard event files, ``checkpoints/``,
``videos/`` and, at the end, ``summary.json``. Scripts with their own envs (LIBERO) call
`train` with an `EnvFactory`. The run's set-up is `reference_trainer.training_run`, its
budget (when to stop for the final evaluation) `reference_trainer.budget`, its summary
`reference_trainer.run_summary`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_trainer.budget import EvaluationPlan, record_video_by_deadline
from reference_trainer.checkpoint import CHECKPOINT_NAME, save_checkpoint
from reference_trainer.config import TrainConfig
from reference_trainer.decoupled_rollout import DecoupledRolloutCollector
from reference_trainer.envs import EnvFactory, GymEnvFactory
from reference_trainer.layout import resolve_layout
from reference_trainer.metrics import summarize_episodes
from reference_trainer.ppo import RewardScaler, compute_gae, ppo_update
from reference_trainer.profile_report import recording, write_profile
from reference_trainer.progress_bar import TrainingBar
from reference_trainer.rollout import Rollout
from reference_trainer.run_log import LOG_FORMAT, RunLog
from reference_trainer.run_summary import summarize_run
from reference_trainer.self_imitation import self_imitation_update
from reference_trainer.training_run import (
    OpenParts,
    TrainingRun,
    build_agent,
    resolve_device,
    run_directory,
    set_up,
)
from reference_trainer.vector_eval import evaluate_on_vector_env

__all__ = ["build_agent", "resolve_device", "run_directory", "train"]

logger = logging.getLogger(__name__)


def _flatten(x: Any) -> Any:
    """``(T, N, ...) -> (T * N, ...)`` for a tensor or a dict of tensors."""
    if isinstance(x, dict):
        return {key: value.reshape(-1, *value.shape[2:]) for key, value in x.items()}
    return x.reshape(-1, *x.shape[2:])


def _advantages(
    rollout: Rollout, scaler: RewardScaler | None, config: TrainConfig, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    ends = rollout.terminated | rollout.truncated
    if scaler is not None:
        rewards = scaler.scale(rollout.rewards, ends)
    else:
        rewards = rollout.rewards.astype(np.float32)
    rewards_t = torch.from_numpy(rewards).to(device) + config.gamma * rollout.final_values
    return compute_gae(
        rewards_t,
        rollout.values,
        torch.from_numpy(ends).to(device),
        rollout.next_value,
        config.gamma,
        config.gae_lambda,
    )


def train(
    config: TrainConfig,
    env_factory: EnvFactory | None = None,
    progress: TrainingBar | None = None,
) -> dict[str, Any]:
    """Train PPO and return the run summary (also written to ``<run_dir>/summary.json``).

    The phases, each a function below: set-up (envs, agent, collector, a resumed run's
    state), then per iteration rollout, update, self-imitation, logging, checkpoint and
    evaluation, until ``total_timesteps``, ``deadline``, ``max_minutes`` or
    ``stop_return`` ends training; then the final evaluation, checkpoint and summary.

    Args:
        config: the run configuration.
        env_factory: builds the envs; default ``GymEnvFactory(config.env_id)``.
        progress: a bar the caller opened for a longer job (`TrainingBar`, ``started`` at
            the job's start), which training continues and the caller closes; None: the
            run opens and closes its own.

    Returns:
        The summary dict: run directory, counters, wall time, the return curve's start and
        end, success rates, throughput and pipeline metrics, final evaluation, versions.

    Raises:
        FileNotFoundError: if ``config.resume`` or ``config.init_checkpoint`` points at no
            checkpoint.
        ValueError: for inconsistent sizes (e.g. fewer decisions than minibatches), both
            ``resume`` and ``init_checkpoint``, or an init checkpoint that does not fit.
    """
    if config.resume and config.init_checkpoint:
        raise ValueError(
            "--resume and --init-checkpoint are exclusive: --resume continues a run (weights, "
            "optimiser, counters); --init-checkpoint starts a new run from weights. Pass one."
        )
    factory: EnvFactory = env_factory or GymEnvFactory(config.env_id)
    device = resolve_device(config.device)
    config, auto_layout = resolve_layout(config, factory, device)  # --num-stages auto
    run_dir = run_directory(config)
    # what the console logs, kept with the run (into the caller's copy if it opened one)
    log_file = RunLog(run_dir / "train.log")
    parts = OpenParts()
    try:
        run = set_up(config, factory, device, run_dir, auto_layout, parts, progress)
        summary = _train_loop(run)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        parts.close()
        log_file.close()


# -- the loop ------------------------------------------------------------------------------


def _train_loop(run: TrainingRun) -> dict[str, Any]:
    """Evaluate first (if asked), iterate until a limit ends training, evaluate, save and
    return the summary."""
    config = run.config
    stopped_early = False
    if config.eval_at_start and not config.resume and config.eval_episodes > 0:
        _evaluate(run, video=False, then_train=True)
    plan = EvaluationPlan(config, run.evaluations)
    first_iteration = run.iteration
    while run.iteration < run.num_iterations:
        if plan.final_evaluation_next():
            _stop_for_the_final_evaluation(run, plan)
            stopped_early = True
            break
        if run.iteration == first_iteration + 1:
            _fit_value_warmup(run, plan)
        run.iteration += 1
        rollout = _rollout(run)
        t0 = time.perf_counter()
        losses, warming_up, kl_coef = _update(run, rollout)
        imitation = _self_imitation(run, rollout, warming_up)
        if not config.freeze_obs_norm:
            # statistics change after the update so the update saw the rollout's inputs
            run.agent.update_obs_rms(_flatten(rollout.obs))
        _record_iteration(run, rollout, losses, imitation, time.perf_counter() - t0, kl_coef)
        plan.rollout_done(rollout)
        if config.checkpoint_every and run.iteration % config.checkpoint_every == 0:
            _save_checkpoint(run, run.run_dir / "checkpoints" / CHECKPOINT_NAME)
        if plan.evaluation_due(run.iteration, run.num_iterations):
            _evaluate(run, video=False, then_train=True, episodes=plan.during_episodes)
            plan.evaluated()
        if _stop_reason(run) is not None:
            stopped_early = True
            break
    return _finish(run, stopped_early)


def _fit_value_warmup(run: TrainingRun, plan: EvaluationPlan) -> None:
    """After the first iteration of a run with a deadline: if the budget holds fewer than
    four times the value warm-up's iterations, the warm-up gets a quarter of them (at
    least one), so that the policy, not the critic alone, trains in the rest."""
    warmup, left = run.config.value_warmup_iterations, plan.iterations_left()
    if left is None or warmup <= 0 or run.iteration > warmup:
        return
    total = run.iteration + left
    if total >= 4 * warmup:
        return
    shorter = max(1, total // 4)
    logger.info(
        "the budget holds about %d iterations: the value warm-up shortened from %d to %d "
        "iterations, so that the policy trains in the others",
        total,
        warmup,
        shorter,
    )
    run.config = dataclasses.replace(run.config, value_warmup_iterations=shorter)


def _stop_for_the_final_evaluation(run: TrainingRun, plan: EvaluationPlan) -> None:
    """Training ends here to leave the final evaluation its time; before any iteration,
    the budget was too short for training: the log and the summary say what it needed
    and what it had."""
    assert run.progress is not None and run.config.deadline is not None
    if run.history:
        logger.info("stopping training to finish the final evaluation by the deadline")
        # one more iteration would not leave the final evaluation its time: the deadline
        # itself is reached only when an evaluation during training ran past it
        reached = time.time() >= run.config.deadline
        run.progress.end("deadline reached" if reached else "time kept for it")
        return
    had_s = run.config.deadline - time.time()
    run.too_short_for_training = {"needed_s": plan.needed_s, "had_s": had_s}
    logger.warning(
        "no training: the budget is too short; one iteration and the final evaluation "
        "need about %.0f s (the final evaluation and its video planned from the "
        "evaluations so far), %.0f s of it were left",
        plan.needed_s,
        had_s,
    )
    run.progress.end("budget too short for training")


def _rollout(run: TrainingRun) -> Rollout:
    """One rollout of ``num_steps`` decisions per env (the learning rate annealed first)."""
    if run.config.anneal_lr:
        frac = 1.0 - (run.iteration - 1) / run.num_iterations
        for group in run.optimizer.param_groups:
            group["lr"] = frac * group["initial_lr"]
    with recording(run.profiler):
        rollout = run.collector.collect()
    run.global_step += rollout.timings.env_steps
    return rollout


def _update(run: TrainingRun, rollout: Rollout) -> tuple[dict[str, float], bool, float]:
    """Advantages and the PPO update (critic only during the value warm-up).

    Returns:
        The update's losses, whether the value warm-up is on, the KL coefficient used.
    """
    config = run.config
    advantages, returns = _advantages(rollout, run.scaler, config, run.device)
    warming_up = run.iteration <= config.value_warmup_iterations
    kl_coef = config.kl_coef * config.kl_decay ** max(
        0, run.iteration - 1 - config.value_warmup_iterations
    )
    if config.kl_coef > 0:
        kl_coef = max(kl_coef, config.kl_coef_min)
    losses = ppo_update(
        run.agent,
        run.optimizer,
        _flatten(rollout.obs),
        _flatten(rollout.actions),
        rollout.logprobs.reshape(-1),
        advantages.reshape(-1),
        returns.reshape(-1),
        rollout.values.reshape(-1),
        run.hp,
        run.shuffle,
        update_actor=not warming_up,
        reference=run.reference,
        kl_coef=kl_coef,
    )
    return losses, warming_up, kl_coef


def _self_imitation(run: TrainingRun, rollout: Rollout, warming_up: bool) -> dict[str, float]:
    """Keep the rollout's successful episodes; past the warm-up, regress onto them."""
    if run.successes is None:
        return {}
    run.successes.add(rollout)
    if warming_up:
        return {"episodes": float(run.successes.num_episodes)}
    return self_imitation_update(
        run.agent,
        run.imitation_optimizer,
        run.successes,
        steps=run.config.self_imitation_steps,
        batch_size=run.config.self_imitation_batch_size,
        generator=run.imitation_draws,
        max_grad_norm=run.config.max_grad_norm,
        sign_mask=run.imitation_sign_mask,
    ).as_scalars()


def _record_iteration(
    run: TrainingRun,
    rollout: Rollout,
    losses: dict[str, float],
    imitation: dict[str, float],
    update_s: float,
    kl_coef: float,
) -> None:
    """The iteration's entry in the history, TensorBoard and the bar."""
    episodes = summarize_episodes(rollout.episodes)
    run.recent_returns.extend(r.episode_return for r in rollout.episodes)
    timings = rollout.timings.as_scalars()
    entry: dict[str, Any] = {
        "iteration": run.iteration,
        "global_step": run.global_step,
        "update_s": update_s,
        "learning_rate": run.optimizer.param_groups[0]["lr"],
        "kl_coef": kl_coef,
        "value_warmup": float(run.iteration <= run.config.value_warmup_iterations),
        "policy_std_mean": float(run.agent.actor_log_std.detach().exp().mean()),
        **{f"rollout/{k}": v for k, v in timings.items()},
        **{f"train/{k}": v for k, v in losses.items()},
        **{f"episode/{k}": v for k, v in episodes.items()},
        **{f"self_imitation/{k}": v for k, v in imitation.items()},
        "_returns": [r.episode_return for r in rollout.episodes],
        "_successes": [[r.env_index, r.success] for r in rollout.episodes if r.success is not None],
    }
    run.history.append(entry)
    if run.writer is not None:
        for key, value in entry.items():
            if key not in ("iteration", "global_step") and not key.startswith("_"):
                run.writer.add_scalar(key, value, run.global_step)
    postfix = {
        "ret": f"{episodes['return_mean']:.3g}" if "return_mean" in episodes else "-",
        "sps": f"{timings['env_steps_per_s']:.0f}",
        "bubble": f"{timings['bubble_fraction']:.2f}",
    }
    if "success_rate" in episodes:
        postfix["succ"] = f"{episodes['success_rate']:.2f}"
    assert run.progress is not None
    run.progress.advance(rollout.timings.env_steps, postfix)


def _stop_reason(run: TrainingRun) -> str | None:
    """Why training stops after this iteration (--max-minutes, --stop-return), or None."""
    config = run.config
    if (
        config.max_minutes is not None
        and time.perf_counter() - run.start >= 60 * config.max_minutes
    ):
        logger.info("time budget of %s minutes reached; stopping", config.max_minutes)
        assert run.progress is not None
        run.progress.end(f"time budget of {config.max_minutes:g} min reached")
        return "max_minutes"
    if (
        config.stop_return is not None
        and len(run.recent_returns) == run.recent_returns.maxlen
        and float(np.mean(run.recent_returns)) >= config.stop_return
    ):
        logger.info("mean return of the last 10 episodes reached %s; stopping", config.stop_return)
        return "stop_return"
    return None


# -- evaluation ----------------------------------------------------------------------------


def _evaluate(
    run: TrainingRun, video: bool, then_train: bool = False, episodes: int | None = None
) -> dict[str, Any]:
    """Deterministic episodes from the factory's fixed initial states on the training
    envs (then back to training if ``then_train``), a video of episode 0 if ``video``;
    the entry is appended to ``run.evaluations``. ``episodes``: the first this many of
    the ``eval_episodes`` (None: all)."""
    config, progress = run.config, run.progress
    assert progress is not None
    episodes = config.eval_episodes if episodes is None else episodes
    eval_start = time.perf_counter()
    what = "before any update" if run.iteration == 0 else f"at iteration {run.iteration}"
    logger.info(
        "evaluating %s: %d deterministic episodes on the %d envs",
        what,
        episodes,
        config.num_envs,
    )
    label = f"eval {what}" if then_train else "final evaluation"
    if not then_train and progress.ended:
        label += f" ({progress.ended})"
    progress.describe(label)
    progress.episodes(0, episodes)
    then_reset_seed = config.seed + run.iteration * config.num_envs if then_train else None
    run.agent.eval()
    if isinstance(run.collector, DecoupledRolloutCollector):
        # through the channel on the training envs, which restart for training after
        result = run.collector.evaluate(
            run.factory, episodes, config.eval_seed, then_reset_seed=then_reset_seed
        )
    else:
        # on the training envs, all workers in parallel, then back to training
        result = evaluate_on_vector_env(
            run.collector,
            run.factory,
            episodes,
            config.eval_seed,
            then_reset_seed=then_reset_seed,
            on_rollout=lambda done: progress.episodes(done, episodes),
        )
    video_s = 0.0
    if video:
        progress.describe(f"{label}: recording a video of one episode")
        name = "after" if not then_train else "before" if run.iteration == 0 else None
        path = run.run_dir / "videos" / f"{name or f'iteration{run.iteration:05d}'}.mp4"
        result.video_path, video_s = record_video_by_deadline(
            run.agent, run.factory, run.device, path, config
        )
    run.agent.train()
    if run.successes is not None:
        run.successes.discard_pending()  # the envs start new episodes after an evaluation
    if then_train:
        progress.describe(progress.label)
    entry = {"iteration": run.iteration, "global_step": run.global_step, **result.as_scalars()}
    entry["subset"] = episodes < config.eval_episodes  # the first `episodes` of them
    entry["video"] = result.video_path
    entry["wall_s"] = time.perf_counter() - eval_start
    entry["video_s"] = video_s
    entry["length_max"] = max(result.lengths, default=0)
    entry["lengths"] = [int(n) for n in result.lengths]
    if result.successes is not None:
        entry["successes"] = [bool(v) for v in result.successes]
    run.evaluations.append(entry)
    logger.info(
        "evaluation at iteration %d (%s env steps): success %s, return %.3f, %d episodes, %.0f s",
        run.iteration,
        f"{run.global_step:,}",
        "n/a" if "success_rate" not in entry else f"{entry['success_rate']:.2f}",
        entry["return_mean"],
        entry["episodes"],
        entry["wall_s"],
    )
    if run.writer is not None:
        for key, value in result.as_scalars().items():
            run.writer.add_scalar(f"eval/{key}", value, run.global_step)
    return entry


# -- checkpoint ----------------------------------------------------------------------------


def _save_checkpoint(run: TrainingRun, path: Path) -> None:
    """Everything a resumed run needs: weights, optimisers, generators, counters, history."""
    successes = run.successes
    save_checkpoint(
        path,
        {
            "agent": run.agent.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "reward_scaler": None if run.scaler is None else run.scaler.state_dict(),
            "noise_generator": run.collector.generator_state(),
            "shuffle_generator": run.shuffle.get_state(),
            "iteration": run.iteration,
            "global_step": run.global_step,
            "history": run.history,
            "evaluations": run.evaluations,
            # the KL term's frozen warm start: a resumed run pulls towards it too
            "kl_reference": None if run.reference is None else run.reference.state_dict(),
            "self_imitation": None
            if successes is None
            else {
                "buffer": successes.state_dict(),
                "optimizer": run.imitation_optimizer.state_dict(),
                "generator": run.imitation_draws.get_state(),
            },
            "wall_s": run.wall_before + time.perf_counter() - run.start,
            "config": dataclasses.asdict(run.config),
        },
    )


# -- summary -------------------------------------------------------------------------------


def _final_evaluation(run: TrainingRun) -> dict[str, Any] | None:
    """The final evaluation; when no iteration ran (the deadline came first), the one
    before training stands for it instead of playing the same episodes again."""
    config = run.config
    if config.eval_episodes <= 0:
        return None
    first = run.evaluations[0] if run.evaluations else None
    if (
        run.iteration == 0
        and first is not None
        and first["iteration"] == 0
        and int(first["episodes"]) == config.eval_episodes
    ):
        logger.info("no training iteration ran: the evaluation before training is the final one")
        return first
    return _evaluate(run, video=config.eval_video)


def _finish(run: TrainingRun, stopped_early: bool) -> dict[str, Any]:
    """Write the profile, run the final evaluation, save the last checkpoint, summarise."""
    config = run.config
    profile = write_profile(run.profiler, run.run_dir) if run.profiler is not None else None
    final_eval = _final_evaluation(run)
    assert run.progress is not None
    if run.owns_progress:
        run.progress.close("done" if final_eval is None else "done: final evaluation")
    _save_checkpoint(run, run.run_dir / "checkpoints" / CHECKPOINT_NAME)
    summary = summarize_run(
        config,
        run.run_dir,
        run.device,
        run.iteration,
        run.global_step,
        run.wall_before + time.perf_counter() - run.start,
        run.history,
        run.evaluations,
        final_eval,
        stopped_early,
        run.too_short_for_training,
    )
    if profile is not None:
        where = f"{run.run_dir}/trace.json, timeline.png, profile.json"
        print(f"profile ({where}): {profile['bottleneck_reason']}")
    return summary


def main() -> None:
    """CLI entry point: parse a ``TrainConfig`` with tyro, train, print the summary path."""
    import tyro

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    config = tyro.cli(TrainConfig)
    summary = train(config)
    print(
        json.dumps(
            {
                k: summary[k]
                for k in ("run_dir", "global_step", "return_start", "return_end", "final_eval")
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
