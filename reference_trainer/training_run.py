"""One training run's parts and state (`TrainingRun`) and its set-up: the envs, the agent
(`build_agent`), the optimisers, the collector, a resumed run's state, the bar."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_trainer.agent import ActorCritic
from reference_trainer.checkpoint import find_checkpoint, load_checkpoint, load_init_checkpoint
from reference_trainer.config import TrainConfig
from reference_trainer.decoupled_rollout import DecoupledRolloutCollector
from reference_trainer.envs import EnvFactory, make_vector_env, num_env_workers
from reference_trainer.ppo import PPOHyperparameters, RewardScaler
from reference_trainer.progress_bar import TrainingBar
from reference_trainer.rollout import RolloutCollector
from reference_trainer.self_imitation import SuccessBuffer, sign_dims_mask

__all__ = ["OpenParts", "TrainingRun", "build_agent", "resolve_device", "run_directory", "set_up"]

logger = logging.getLogger(__name__)


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


@dataclass
class TrainingRun:
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
    owns_progress: bool = True
    """The bar is the run's own (`train` closes it), not a caller's."""
    too_short_for_training: dict[str, float] | None = None
    """Set when the deadline left no time for one iteration: ``needed_s``, ``had_s``."""


@dataclass
class OpenParts:
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


def set_up(
    config: TrainConfig,
    factory: EnvFactory,
    device: torch.device,
    run_dir: Path,
    auto_layout: dict[str, Any] | None,
    parts: OpenParts,
    progress: TrainingBar | None = None,
) -> TrainingRun:
    """Seed, save the config, build the envs, agent, optimiser and collector, load a
    resumed run's state, reset the envs and open TensorBoard and the bar (``progress``:
    the caller's bar, which training continues and the caller closes)."""
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
    run = TrainingRun(
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
    if progress is None:
        parts.progress = run.progress = _progress_bar(run)
    else:
        progress.start_training(
            "train", run.num_iterations * run.steps_per_iteration, run.global_step
        )
        run.progress, run.owns_progress = progress, False
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


def _resume(run: TrainingRun, path: Path) -> None:
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
    logger.info(
        "resumed from %s at iteration %d, step %s", path, run.iteration, f"{run.global_step:,}"
    )


def _progress_bar(run: TrainingRun) -> TrainingBar:
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
