"""The main job: PPO fine-tuning of a behaviour-cloned policy on one LIBERO task.

With no arguments this is one run of at most ``--budget-minutes`` 15 for the whole
command on a 2-core CPU, in five steps:

1. demos: a scripted expert (privileged sim state) plays ``--demo-init-states`` (6 init
   states, no noise), collected through a `PipelinedVectorEnv`;
2. BC: the PPO actor is cloned on them (goal features, a 2x128 MLP) until the held-out
   action error has not improved for 400 epochs (more BC barely raises its success:
   --bc-control);
3. evaluate: the BC policy, deterministic, on ``--eval-init-states`` (20 init states no
   demo used), on the training envs' workers in parallel;
4. PPO fine-tuning from the BC weights on the training init states (value warm-up, a low
   per-dimension std, a KL pull to the BC policy), 2-stage pipelined rollout,
   until the deadline leaves just enough time for
5. evaluate: the same 20 init states.

It prints the success rate before and after RL and writes, in the run directory,
``summary.json`` (``eval_success_rate_initial``, ``eval_success_rate_final``,
``eval_episodes``, phase wall times), ``learning_curve.png`` (success rate and return
against env steps), ``videos/`` (an evaluation episode before and after), the demos, the
BC checkpoint and the trainer's checkpoints and TensorBoard files.

``--from-scratch`` is the other recipe: no demos and no BC, PPO from a random policy
(no KL, no warm-up); in minutes on a CPU it shows a shaped return rising and a success
rate near 0. ``--bc-control`` is the control of the fine-tuning: the same demos and
evaluations, but the minutes RL would get go to a longer BC run instead.

Every ``TrainConfig`` field is a flag (``--help``), plus the LIBERO ones below.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import tyro

from reference_trainer.config import NumStages, TrainConfig
from reference_trainer.run_log import LOG_FORMAT, RunLog
from reference_trainer.train import run_directory, train

SUMMARY_KEYS = ("eval_success_rate_initial", "eval_success_rate_final", "eval_episodes")
"""Keys of ``summary.json`` that outside checks read."""


@dataclass
class LiberoTrainConfig(TrainConfig):
    """LIBERO main job: demos -> BC -> evaluate -> PPO fine-tuning -> evaluate, <= 15 min on 2 CPUs.

    --from-scratch: PPO from a random policy instead (no demos, no BC); --bc-control: the
    RL minutes go to a longer BC run instead (the control of the fine-tuning).
    """

    env_id: str = "libero"
    """Label of the run (the env comes from --suite and --task-id)."""
    suite: Literal["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"] = (
        "libero_object"
    )
    """LIBERO suite."""
    task_id: int = 0
    """Task index within the suite."""
    chunk_size: int = 1
    """Actions per policy decision (action chunk K), executed inside the env worker."""
    state_features: Literal["goal", "full", "both"] = "goal"
    """State observation: goal features (23 privileged values about the goal object and
    target), the full state vector, or both (see docs/libero.md)."""
    cameras: tuple[Literal["agentview", "wrist"], ...] = ()
    """Camera observations for the CNN (empty: state only, ~10x faster on CPU)."""
    image_size: int = 128
    """Camera image side in pixels."""
    dense_reward: bool = True
    """Train on dense goal shaping (success is always logged from the sparse signal)."""
    shaping_scale: float = 1.0
    """Multiplier of the shaping term."""
    horizon: int | None = None
    """Primitive steps before truncation (None: the suite's evaluation horizon)."""
    train_init_states: str = "0:30"
    """Init states training episodes start from (at random), e.g. '0:30'."""
    eval_init_states: str = "30:50"
    """Init states of the evaluations, one episode each (default: 20 no demo used); this
    sets the number of evaluation episodes (--eval-episodes is ignored here)."""

    # -- the main job's steps --------------------------------------------------------------
    from_scratch: bool = False
    """PPO from a random policy: no demos, no BC, no KL, no value warm-up."""
    bc_control: bool = False
    """Control run: demos, BC, evaluate, then the minutes RL would get go to a second,
    longer BC run (no early stop before the deadline), then evaluate; no RL."""
    budget_minutes: float | None = 15.0
    """One deadline for the whole command (demos, BC, evaluations, training); None: the
    other limits (--total-timesteps, --max-minutes) alone."""
    demo_init_states: str = "0:6"
    """Init states the expert demonstrates (one episode each)."""
    demo_noise_std: float = 0.0
    """DART noise on xyz while collecting demos (0: clean demos, a middling BC policy)."""
    bc_max_epochs: int = 4000
    """Most BC epochs."""
    bc_patience: int = 400
    """BC stops after this many epochs without a better held-out action error."""
    bc_heldout: Literal["random", "last"] = "last"
    """Demos BC holds out to measure its action error: the last one (the same split for
    every --seed) or drawn with the seed."""

    # -- PPO, fine-tuning defaults ---------------------------------------------------------
    num_envs: int = 4
    num_stages: NumStages = 2
    num_steps: int = 64
    total_timesteps: int = 400_000
    learning_rate: float = 1e-4
    anneal_lr: bool = False
    num_minibatches: int = 4
    update_epochs: int = 4
    target_kl: float | None = 0.02
    hidden_sizes: tuple[int, ...] = (128, 128)
    init_log_std: float = -0.5
    init_log_std_per_dim: tuple[float, ...] = (-3.0, -3.0, -3.0, -3.9, -3.9, -3.9, -3.9)
    explore_dims: tuple[int, ...] = (0, 1, 2)
    actor_learning_rate: float | None = 3e-5
    value_warmup_iterations: int = 20
    kl_coef: float = 1.0
    kl_decay: float = 1.0
    self_imitation_steps: int = 16
    freeze_obs_norm: bool = True
    eval_at_start: bool = True
    max_minutes: float | None = None
    eval_episodes: int = 20
    video_fps: int = 20
    checkpoint_every: int = 20


def _make_libero_env(
    suite: str,
    task_id: int,
    chunk_size: int,
    state_features: str,
    cameras: tuple[str, ...],
    image_size: int,
    reward_type: str,
    shaping_scale: float,
    horizon: int | None,
    render: bool,
    init_state_ids: tuple[int, ...] | None = None,
) -> gym.Env:
    from pipelined_vec_env.libero.env import LiberoEnv
    from pipelined_vec_env.wrappers.action_chunk import ActionChunk

    env: gym.Env = LiberoEnv(
        suite,
        task_id,
        cameras=cameras,
        image_size=image_size,
        reward_type=reward_type,
        shaping_scale=shaping_scale,
        horizon=horizon,
        state_features=state_features,
        render_mode="rgb_array" if render else None,
    )
    if init_state_ids:
        env = RandomInitStates(env, init_state_ids)
    return ActionChunk(env, chunk_size) if chunk_size > 1 else env


class RandomInitStates(gym.Wrapper):
    """Start each episode from an init state drawn from ``init_state_ids`` (the env's RNG).

    An explicit ``options["init_state_id"]`` (evaluation) wins; so training can keep
    away from the evaluation's init states.

    Args:
        env: a `LiberoEnv`.
        init_state_ids: the allowed ids (non-empty).

    Raises:
        ValueError: if ``init_state_ids`` is empty.
    """

    def __init__(self, env: gym.Env, init_state_ids: Sequence[int]) -> None:
        super().__init__(env)
        if not init_state_ids:
            raise ValueError("init_state_ids: expected at least one id")
        self.init_state_ids = [int(k) for k in init_state_ids]
        self._rng = np.random.default_rng()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Reset to a random allowed init state unless ``options`` names one."""
        options = dict(options or {})
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if options.get("init_state_id") is None:
            pick = int(self._rng.integers(len(self.init_state_ids)))
            options["init_state_id"] = self.init_state_ids[pick]
        return self.env.reset(seed=seed, options=options)


def _ids(text: str) -> tuple[int, ...]:
    from pipelined_vec_env.libero.collect import parse_init_states

    return tuple(parse_init_states(text))


@dataclass
class LiberoEnvFactory:
    """The LIBERO part of the trainer: build LIBERO envs, fix eval init states."""

    config: LiberoTrainConfig
    steps_info_key: str | None = "chunk_steps_executed"

    @property
    def steps_per_decision(self) -> int:
        """Primitive steps per decision: the chunk length."""
        return self.config.chunk_size

    def env_fn(self, index: int, *, render: bool = False) -> Callable[[], gym.Env]:
        """Constructor of env ``index`` (training resets draw from --train-init-states)."""
        c = self.config
        return functools.partial(
            _make_libero_env,
            c.suite,
            c.task_id,
            c.chunk_size,
            c.state_features,
            tuple(c.cameras),
            c.image_size,
            "dense" if c.dense_reward else "sparse",
            c.shaping_scale,
            c.horizon,
            render,
            _ids(c.train_init_states) if c.train_init_states else None,
        )

    def eval_reset_options(self, episode: int) -> dict[str, Any] | None:
        """Evaluation episode ``j`` starts from the ``j``-th of --eval-init-states."""
        ids = _ids(self.config.eval_init_states)
        return {"init_state_id": ids[episode % len(ids)]}


def _fixed_stages(config: LiberoTrainConfig) -> int:
    """Stages of the vector envs outside training (demos, a checkpoint's evaluation):
    --num-stages, or 2 with "auto" (tune measures the training loop only)."""
    return config.num_stages if isinstance(config.num_stages, int) else 2


def _obs_keys(state_features: str) -> tuple[str, ...]:
    return {"goal": ("goal_features",), "full": ("state",), "both": ("goal_features", "state")}[
        state_features
    ]


def _warm_start(config: LiberoTrainConfig, run_dir: Path, deadline: float | None) -> dict[str, Any]:
    """Collect the expert demos and clone them; return what the summary records."""
    from pipelined_vec_env.libero.collect import collect_demos
    from pipelined_vec_env.libero.demos import write_demos
    from reference_trainer.bc import BCConfig, train_bc

    t0 = time.perf_counter()
    ids = list(_ids(config.demo_init_states))
    overlap = set(ids) & set(_ids(config.eval_init_states))
    if overlap:
        raise ValueError(
            f"--demo-init-states and --eval-init-states share init states {sorted(overlap)}; "
            "the evaluation must use init states no demo used"
        )
    logger.info(
        "collecting %d expert demos (init states %s, %d LIBERO envs; about a minute)",
        len(ids),
        config.demo_init_states,
        min(config.num_envs, len(ids)),
    )
    demos = collect_demos(
        config.suite,
        config.task_id,
        ids,
        noise_std=config.demo_noise_std,
        num_envs=min(config.num_envs, len(ids)),
        num_stages=min(_fixed_stages(config), config.num_envs, len(ids)),
        state_features="both",
        horizon=None,  # the suite's: the expert needs ~120 steps whatever --horizon says
        seed=config.seed,
    )
    demo_path = run_dir / "demos.hdf5"
    write_demos(demo_path, demos)
    demos_s = time.perf_counter() - t0
    info = demos.attrs["collection"]
    logger.info(
        "%d demos (%d/%d expert successes) in %.0f s",
        len(demos),
        info["successes"],
        info["attempts"],
        demos_s,
    )
    t1 = time.perf_counter()
    bc = train_bc(
        BCConfig(
            demos=str(demo_path),
            output=str(run_dir / "bc.pt"),
            obs_keys=_obs_keys(config.state_features),
            chunk_size=config.chunk_size,
            hidden_sizes=tuple(config.hidden_sizes),
            max_epochs=config.bc_max_epochs,
            patience=config.bc_patience,
            heldout=config.bc_heldout,
            seed=config.seed,
            torch_threads=1,
        )
    )
    return {
        "demos": {
            "path": str(demo_path),
            "kept": len(demos),
            "expert_successes": info["successes"],
            "attempts": info["attempts"],
            "steps": demos.num_samples,
            "noise_std": config.demo_noise_std,
            "wall_s": demos_s,
        },
        "bc": {**bc.metrics, "checkpoint": bc.checkpoint, "wall_s": time.perf_counter() - t1},
    }


logger = logging.getLogger("train_libero")


def run(config: LiberoTrainConfig) -> dict[str, Any]:
    """Run the main job (or --from-scratch / --bc-control) and return its summary.

    The run directory's ``train.log`` holds the whole job's log lines, from the first
    (demos, BC) to the last of `train` (a resumed run appends).

    Raises:
        ValueError: for demo and evaluation init states that overlap, both
            --from-scratch and --bc-control, or --resume without --from-scratch.
        FileNotFoundError: if --resume points at no checkpoint.
    """
    start = time.time()
    load_start = os.getloadavg()
    if config.from_scratch and config.bc_control:
        raise ValueError("--from-scratch and --bc-control are exclusive")
    deadline = None if config.budget_minutes is None else start + 60 * config.budget_minutes
    if config.run_name is None:
        mode = (
            "scratch" if config.from_scratch else "bccontrol" if config.bc_control else "finetune"
        )
        config = dataclasses.replace(
            config,
            run_name=f"{config.suite}_task{config.task_id}_{mode}__s{config.seed}__{os.getpid()}",
        )
    if config.resume and not config.from_scratch:
        raise ValueError(
            "--resume continues a --from-scratch run only: the fine-tuning recipe and "
            "--bc-control start a new run from new demos and BC (--init-checkpoint, which "
            "--resume excludes)"
        )
    config = dataclasses.replace(config, eval_episodes=len(_ids(config.eval_init_states)))
    run_dir = run_directory(config)  # the directory train() writes into (a resumed run's)
    log_file = RunLog(run_dir / "train.log")  # the whole job's log; train() writes into it
    try:
        return _run(config, run_dir, deadline, start, load_start)
    finally:
        log_file.close()


def _run(
    config: LiberoTrainConfig,
    run_dir: Path,
    deadline: float | None,
    start: float,
    load_start: tuple[float, float, float],
) -> dict[str, Any]:
    logger.info(
        "%s on %s task %d, %s",
        "PPO from scratch"
        if config.from_scratch
        else "demos -> BC -> evaluate -> "
        + ("longer BC" if config.bc_control else "PPO fine-tuning")
        + " -> evaluate",
        config.suite,
        config.task_id,
        "no time budget"
        if config.budget_minutes is None
        else f"all within {config.budget_minutes:g} min",
    )
    extra: dict[str, Any] = {"mode": "finetune"}
    if config.from_scratch:
        extra["mode"] = "scratch"
        config = dataclasses.replace(
            config,
            kl_coef=0.0,
            value_warmup_iterations=0,
            freeze_obs_norm=False,
            init_log_std_per_dim=(),
            explore_dims=(),
            actor_learning_rate=None,
            target_kl=None,
            self_imitation_steps=0,
        )
    else:
        extra.update(_warm_start(config, run_dir, deadline))
        config = dataclasses.replace(config, init_checkpoint=extra["bc"]["checkpoint"])
    if config.bc_control:
        extra["mode"] = "bc_control"
        summary = _bc_control(config, run_dir, deadline)
    else:
        summary = train(dataclasses.replace(config, deadline=deadline), LiberoEnvFactory(config))
    extra["total_wall_s"] = time.time() - start
    extra["budget_minutes"] = config.budget_minutes
    extra["loadavg_start"] = list(load_start)
    extra["loadavg_end"] = list(os.getloadavg())
    extra["cpu_count"] = os.cpu_count()
    summary.update(extra)
    summary["learning_curve"] = _plot_learning_curve(summary, run_dir / "learning_curve.png")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _evaluate_checkpoint(config: LiberoTrainConfig, checkpoint: str) -> dict[str, Any]:
    """Evaluate a BC checkpoint as the trainer does: on a 2-stage vector env's workers."""
    import torch

    from reference_trainer.agent import ActorCritic
    from reference_trainer.checkpoint import load_init_checkpoint
    from reference_trainer.envs import make_vector_env
    from reference_trainer.rollout import RolloutCollector
    from reference_trainer.vector_eval import evaluate_on_vector_env

    factory = LiberoEnvFactory(config)
    device = torch.device("cpu")
    envs = make_vector_env(factory, config.num_envs, num_stages=_fixed_stages(config))
    try:
        agent = ActorCritic(
            envs.single_observation_space,
            envs.single_action_space,
            hidden_sizes=config.hidden_sizes,
        )
        load_init_checkpoint(agent, Path(checkpoint), device)
        collector = RolloutCollector(
            envs,
            agent,
            config.num_steps,
            device,
            steps_info_key=factory.steps_info_key,
            steps_per_decision=factory.steps_per_decision,
        )
        t0 = time.perf_counter()
        result = evaluate_on_vector_env(collector, factory, config.eval_episodes, config.eval_seed)
    finally:
        envs.close()
    return {
        "iteration": 0,
        "global_step": 0,
        **result.as_scalars(),
        "successes": [bool(v) for v in result.successes or []],
        "wall_s": time.perf_counter() - t0,
        "checkpoint": checkpoint,
    }


def _bc_control(config: LiberoTrainConfig, run_dir: Path, deadline: float | None) -> dict[str, Any]:
    """Evaluate the BC policy, train BC again for the minutes RL would get, evaluate."""
    from reference_trainer.bc import BCConfig, train_bc

    t0 = time.time()
    before = _evaluate_checkpoint(config, str(config.init_checkpoint))
    eval_s = time.time() - t0
    left = 0.0 if deadline is None else deadline - time.time() - 1.2 * eval_s - 10
    minutes = max(0.1, left / 60)
    bc = train_bc(
        BCConfig(
            demos=str(run_dir / "demos.hdf5"),
            output=str(run_dir / "bc_long.pt"),
            obs_keys=_obs_keys(config.state_features),
            chunk_size=config.chunk_size,
            hidden_sizes=tuple(config.hidden_sizes),
            max_epochs=10**9,
            patience=10**9,
            max_minutes=minutes,
            heldout=config.bc_heldout,
            seed=config.seed,
            torch_threads=1,
        )
    )
    after = _evaluate_checkpoint(config, bc.checkpoint)
    return {
        "run_dir": str(run_dir),
        "eval_success_rate_initial": before["success_rate"],
        "eval_success_rate_final": after["success_rate"],
        "eval_episodes": int(after["episodes"]),
        "evaluations": [before, after],
        "final_eval": after,
        "bc_long": {**bc.metrics, "minutes": minutes},
        "global_step": 0,
        "wall_s": time.time() - t0,
    }


def _plot_learning_curve(summary: dict[str, Any], path: Path) -> str | None:
    """Success rate and return against env steps: training episodes and evaluations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluations = summary.get("evaluations") or []
    fig, (ax_s, ax_r) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)

    def smoothed(curve: list[Any]) -> tuple[Sequence[float], np.ndarray, int]:
        # a training iteration ends ~1 episode per env: a moving mean over iterations
        steps, values = zip(*curve, strict=True)
        k = max(1, min(25, len(values) // 8))
        return steps[k - 1 :], np.convolve(np.asarray(values), np.ones(k) / k, "valid"), k

    panels = (  # (axes, training curve, evaluation key, evaluation label, y label)
        (
            ax_s,
            "success_curve",
            "success_rate",
            "evaluation (deterministic, held-out)",
            "success rate",
        ),
        (ax_r, "return_curve", "return_mean", "evaluation", "return per episode"),
    )
    for ax, curve_key, eval_key, eval_label, ylabel in panels:
        curve = summary.get(curve_key) or []
        if curve:
            steps, smooth, k = smoothed(curve)
            ax.plot(steps, smooth, label=f"training episodes (mean of {k} iterations)")
        points = [(e["global_step"], e[eval_key]) for e in evaluations if eval_key in e]
        if points:
            # markers only: nothing was measured between two evaluations
            ax.plot(*zip(*points, strict=True), "o", markersize=7, label=eval_label)
        ax.set_ylabel(ylabel)
        ax.legend(loc="best", fontsize=8)
    ax_s.set_ylim(-0.05, 1.05)
    ax_r.set_xlabel("env steps")
    fig.suptitle(f"{summary.get('mode', '')}: {Path(summary['run_dir']).name}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def main() -> None:
    """Parse the config, run the main job, print success before and after."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    # PyOpenGL logs "OpenGL_accelerate module loaded" at INFO when the video renderer starts
    logging.getLogger("OpenGL").setLevel(logging.WARNING)
    config = tyro.cli(LiberoTrainConfig)
    if config.eval_video or config.cameras:
        # headless rendering; an explicit MUJOCO_GL (e.g. osmesa) wins
        os.environ.setdefault("MUJOCO_GL", "egl")
    summary = run(config)

    def fmt(value: float | None, spec: str = ".2f") -> str:
        return "n/a" if value is None else format(value, spec)

    n = summary["eval_episodes"]
    print()
    print(f"run directory:           {summary['run_dir']} ({summary['mode']})")
    if "demos" in summary:
        d, b = summary["demos"], summary["bc"]
        print(
            f"demos, BC:               {d['kept']} expert demos ({d['steps']} steps, {d['wall_s']:.0f} s); "
            f"BC held-out action MSE {b['heldout_mse']:.4f} ({b['wall_s']:.0f} s)"
        )
    label = "after longer BC" if summary["mode"] == "bc_control" else "after RL"
    print(
        f"success rate:            {fmt(summary['eval_success_rate_initial'])} before -> "
        f"{fmt(summary['eval_success_rate_final'])} {label}, {n} deterministic episodes "
        f"from init states {config.eval_init_states}"
    )
    throughput = summary.get("throughput") or {}
    if throughput:
        print(
            f"training:                {summary['global_step']} env steps, "
            f"{fmt(throughput.get('env_steps_per_s_rollout'), '.1f')} env steps/s in rollouts, "
            f"bubble {fmt(throughput.get('bubble_fraction'))}"
        )
    print(
        f"whole command:           {summary['total_wall_s']:.0f} s (budget {summary['budget_minutes']} min)"
    )
    videos = [e["video"] for e in summary.get("evaluations", []) if e.get("video")]
    if videos:
        print(f"videos:                  {', '.join(videos)}")
    print(f"learning curve:          {summary['learning_curve']}")
    print(json.dumps({"summary": os.path.join(summary["run_dir"], "summary.json")}))


if __name__ == "__main__":
    main()
