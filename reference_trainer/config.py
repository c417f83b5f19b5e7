"""Training configuration: one dataclass of documented fields, parsed by tyro.

Each field's docstring is its ``--help`` text. Counts of env steps are primitive simulator
steps; with action chunks of ``K`` actions one policy decision is ``K`` env steps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Literal

import tyro

__all__ = ["NumStages", "TrainConfig"]

NumStages = Annotated[int | Literal["auto"], tyro.conf.arg(metavar="INT|auto")]
"""Type of ``--num-stages``: a stage count, or "auto" (`pipelined_vec_env.tune` picks)."""


@dataclass
class TrainConfig:
    """PPO with a pipelined rollout over a staged vector env."""

    # -- environment and pipeline ---------------------------------------------------------
    env_id: str = "InvertedPendulum-v5"
    """gymnasium id of the env (ignored when a script passes its own env factory)."""
    num_envs: int = 8
    """Number of parallel envs."""
    num_stages: NumStages = 2
    """Pipeline stages the envs are split into (contiguous, sizes differ by at most one);
    "auto": measure the envs and the policy with pipelined_vec_env.tune and take its layout
    (stages, envs per worker, or decoupled mode with one actor; see docs/tune.md)."""
    tune_seconds: float = 30.0
    """With --num-stages auto: most seconds tune may take."""
    envs_per_worker: int | None = None
    """Envs per subprocess worker; None: about one worker per usable core in each stage
    (pipelined_vec_env.default_envs_per_worker)."""
    pipelined: bool = True
    """Overlap inference on one stage with env stepping of the others; False: serial loop."""
    stage_order: Literal["round_robin", "first_ready"] = "round_robin"
    """Next stage to wait for: fixed round robin, or whichever stage finished first."""
    cpu_affinity: Literal["none", "auto"] = "none"
    """Pin env workers to cores ("auto") or leave placement to the OS ("none")."""
    worker_nice: int | Literal["idle"] | None = None
    """Nice value of env workers (-20 to 19) or "idle" (SCHED_IDLE), as
    PipelinedVectorEnv(worker_nice=...); None: the env's default (the trainer's priority)."""
    max_restarts: int = 0
    """Restarts allowed per env worker (0: a crashed simulator ends the run). A rebuilt
    worker's episodes end with truncated=True; see docs/fault_tolerance.md."""
    step_deadline: float | None = None
    """Seconds an env worker may take per step before it is killed and handled as a crash
    (restarted within --max-restarts); None: no deadline."""
    backend: Literal["multiprocessing", "ray"] = "multiprocessing"
    """Env workers as subprocesses of the trainer, or as Ray actors on a Ray cluster
    (needs the ray extra; see docs/ray.md). The policy stays in the trainer process."""
    ray_address: str | None = None
    """With backend="ray": Ray cluster address ("auto", "ray://head:10001"); None: the
    RAY_ADDRESS variable, else a new local Ray instance."""
    ray_num_cpus: float = 1.0
    """With backend="ray": CPUs each env worker actor reserves."""
    decoupled: bool = False
    """Decoupled rollouts (RLinf's decoupled mode): env workers post observations to a shared
    channel and --num-actors inference threads batch whatever is posted; evaluation runs
    through it too. Replaces --pipelined; any --num-stages works. See docs/decoupled.md."""
    num_actors: int = 1
    """With --decoupled: inference actor threads (at most the number of env workers)."""
    rollout_queue_size: int = 0
    """With --decoupled: most env batches an actor merges into one forward pass (0: ceil(env
    workers / actors))."""
    max_wait: float = 0.0
    """With --decoupled: seconds an actor waits for more requests after the first."""

    # -- PPO -------------------------------------------------------------------------------
    total_timesteps: int = 1_000_000
    """Primitive env steps to train for (across all envs)."""
    num_steps: int = 256
    """Decisions per env per rollout; a rollout is num_steps * num_envs decisions."""
    learning_rate: float = 3e-4
    """Adam learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over training."""
    gamma: float = 0.99
    """Discount per decision."""
    gae_lambda: float = 0.95
    """GAE lambda (Schulman et al. 2016)."""
    num_minibatches: int = 32
    """Minibatches per epoch of the PPO update."""
    update_epochs: int = 10
    """Epochs over each rollout."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    clip_coef: float = 0.2
    """PPO ratio clip (Schulman et al. 2017), also used to clip the value update."""
    clip_vloss: bool = True
    """Clip the value-function update around the rollout's values."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Stop an update's epochs early when the approximate KL exceeds this (None: never)."""
    normalize_obs: bool = True
    """Normalise the state vector with running statistics kept in the agent."""
    normalize_reward: bool = True
    """Scale rewards by the running std of the discounted return."""

    # -- network ---------------------------------------------------------------------------
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the actor and critic MLPs."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy."""

    # -- fine-tuning from a warm start (--init-checkpoint) ----------------------------------
    init_log_std_per_dim: tuple[float, ...] = ()
    """Initial log std per action dimension, e.g. 7 values for LIBERO's (xyz, rotation,
    gripper); repeated over an action chunk. Empty: --init-log-std for every dimension."""
    explore_dims: tuple[int, ...] = ()
    """Action dimensions that explore (indices of one action, repeated over a chunk); the
    others act with the policy mean and PPO leaves them to the KL term. Empty: all. LIBERO:
    rotation noise the goal features cannot see undoes a cloned grasp (docs/trainer.md)."""
    value_warmup_iterations: int = 0
    """Iterations at the start in which only the critic learns (the actor and its std
    stay as loaded), so the first policy updates use a fitted value function."""
    actor_learning_rate: float | None = None
    """Adam learning rate of the actor and its log std (None: --learning-rate for all); a
    warm-started actor with a small std wants a smaller one than the fresh critic."""
    kl_coef: float = 0.0
    """Weight of KL(policy || starting policy) on the update's observations (0: none):
    keeps the fine-tuned actor near its warm start while the critic is still poor."""
    kl_decay: float = 1.0
    """Factor applied to --kl-coef every iteration after the value warm-up."""
    kl_coef_min: float = 0.0
    """Floor of the decaying KL coefficient (the pull to the warm start never ends)."""
    self_imitation_steps: int = 0
    """Self-imitation (Oh et al. 2018): after each PPO update (past the value warm-up), this
    many gradient steps regress the actor's mean onto the actions of its own successful
    training episodes (success: info["is_success"], the task's sparse signal); 0: off. No expert is involved."""
    self_imitation_lr: float = 1e-4
    """Adam learning rate of the self-imitation steps (the actor's mean only)."""
    self_imitation_batch_size: int = 256
    """Decisions per self-imitation step, drawn uniformly from the success buffer."""
    self_imitation_capacity: int = 20_000
    """Decisions the success buffer keeps (the oldest successful episodes go first)."""
    self_imitation_per_env: bool = False
    """Split the success buffer equally over the envs and draw equally from each env's
    successes: with env i on task i % tasks, every task gets the same share of the
    imitation (a uniform draw favours the tasks that succeed most often and soonest)."""
    self_imitation_sign_dims: tuple[int, ...] = ()
    """Action dimensions (of one action, repeated over a chunk) whose self-imitation target
    is the sign of the action taken, not its value: for an env that acts on the sign
    alone, as robosuite's gripper does (LIBERO: 6). Successful episodes that opened or
    closed the hand then pull the mean to -1 or +1 there, where regressing onto the raw
    values averages them toward 0, the threshold, and leaves the mean undecided."""
    freeze_obs_norm: bool = False
    """Keep the observation normaliser as loaded (a BC actor's inputs stay what it was
    trained on) instead of updating it from rollouts."""
    eval_at_start: bool = False
    """Evaluate once before any update (the warm start's success); no video."""
    deadline: float | None = None
    """Unix time by which the run, its final evaluation included, should end: training
    stops early enough for the final evaluation (estimated from the previous one)."""

    # -- run -------------------------------------------------------------------------------
    seed: int = 1
    """Seed for envs (env i gets seed + i), network init, noise and minibatch order."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Policy device: "auto" picks CUDA when available, else CPU."""
    torch_threads: int = 0
    """Torch CPU threads; 0 picks max(1, cores - env workers) so simulators keep their cores."""
    run_dir: str = "runs"
    """Parent directory of run directories."""
    run_name: str | None = None
    """Run directory name (default: env, seed and a timestamp)."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many iterations (0: only at the end)."""
    resume: str | None = None
    """Checkpoint file or run directory to resume from (weights, optimiser, counters, RNG)."""
    init_checkpoint: str | None = None
    """Start a new run from these weights: a BC checkpoint (reference_trainer.bc: actor and
    observation normaliser) or a trainer checkpoint / run directory (actor, log std,
    normaliser and critic). Optimiser and counters start fresh. Exclusive with --resume."""
    eval_every: int = 0
    """Evaluate every this many iterations (0: only at the end)."""
    eval_every_minutes: float | None = None
    """Evaluate again once this many minutes of training passed since the last
    evaluation, if the deadline leaves room for it and the final one (None: never)."""
    eval_during_episodes: int = 0
    """Episodes of each evaluation during training (--eval-every, --eval-every-minutes):
    the first this many of the --eval-episodes, from the same init states / seeds; 0: all
    of them. The evaluations before and after training always play all."""
    eval_episodes: int = 10
    """Evaluation episodes, each from a fixed init state / seed (episode j: eval_seed + j)."""
    eval_seed: int = 10_000
    """First seed of the evaluation episodes."""
    eval_video: bool = True
    """After the final evaluation, record its episode 0 as videos/after.mp4 (played again
    on a rendering env in the trainer's process; needs an offscreen renderer). The
    evaluations before and during training record none."""
    eval_video_s: float = 30.0
    """Seconds the final evaluation's video is planned to take when the run has a deadline,
    while none has been recorded in the run (then 1.2 times the one measured). The video
    itself gets what is left before the deadline (less the trainer's FINISH_MARGIN_S,
    5 s) and is cut there."""
    video_fps: int = 20
    """Frames per second of evaluation videos."""
    max_minutes: float | None = None
    """Stop training after this many minutes of wall time (the final evaluation still runs)."""
    stop_return: float | None = None
    """Stop early once the mean return of the last 10 training episodes reaches this."""
    tensorboard: bool = True
    """Write TensorBoard scalars to the run directory."""
    progress: bool = True
    """Show a tqdm progress bar. A run that ends on the clock (--max-minutes, --deadline, a
    script's time budget) counts seconds of that budget, with the env steps beside it as
    steps=; any other run counts env steps. It ends full. Its fields, from the last
    rollout: ret (mean return of the training episodes that ended in it), succ (their
    success rate: the exploring policy on training init states, not the evaluation), sps
    (env steps per second of rollout wall time), bubble (fraction of that time the policy
    sat idle); during an evaluation, how many of its episodes are done."""
    profile: bool = False
    """Profile the rollouts (updates and evaluations left out): write trace.json (Perfetto /
    chrome://tracing), timeline.png and profile.json (the summary) into the run directory
    and print the bottleneck at the end. See docs/profiling.md."""

    def resolved_torch_threads(self, num_workers: int) -> int:
        """Threads for torch: the explicit setting, or cores left over by the env workers.

        Args:
            num_workers: number of env worker processes.

        Returns:
            At least 1.
        """
        if self.torch_threads > 0:
            return self.torch_threads
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, (cores or 1) - num_workers)
