"""Behaviour cloning: pretrain the PPO actor on a demonstration file (the warm start).

The actor is the trainer's own `ActorCritic` (same observation encoder, MLP and action
chunk layout), so its weights load into PPO with ``--init-checkpoint`` unchanged. The
actor's mean is regressed onto the demonstrated actions with MSE; for action chunks of
``K`` the target of step ``t`` is ``actions[t : t + K]`` (repeating the episode's last
action past its end), the chunk the actor emits and the env executes open loop. The
observation normaliser is fitted on the training demos and saved with the actor.
Demos are split into training and held-out *episodes*; training stops when the held-out
action error has not improved for ``patience`` epochs and the best epoch is kept.

Run it on a demo file (`pipelined_vec_env.libero.collect` writes one)::

    python -m reference_trainer.bc --demos demos/object_task0.hdf5 --output runs/bc/bc.pt \\
        --eval-init-states 30:50

Sources: Pomerleau 1989 (ALVINN) and Bain & Sammut 1995 for behaviour cloning; Zhao et
al. 2023 (ACT) for action chunks as regression targets.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from reference_trainer.agent import ActorCritic
from reference_trainer.checkpoint import BC_FORMAT, save_checkpoint

__all__ = [
    "BCConfig",
    "BCResult",
    "actor_mean",
    "actor_state_dict",
    "chunk_targets",
    "evaluate_on_libero",
    "fit_normalizer",
    "train_bc",
]

logger = logging.getLogger(__name__)


@dataclass
class BCConfig:
    """Behaviour cloning of the PPO actor on a robomimic/LIBERO-layout demo file."""

    demos: str
    """The hdf5 demonstration file."""
    output: str = "runs/bc/bc_checkpoint.pt"
    """Where to write the BC checkpoint (load it with the trainer's --init-checkpoint)."""
    obs_keys: tuple[str, ...] = ("goal_features",)
    """Observation keys the actor reads (LIBERO: goal_features, state, or both)."""
    chunk_size: int = 1
    """Actions per decision (K); must match the trainer's --chunk-size."""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """Actor MLP hidden sizes; must match the trainer's --hidden-sizes."""
    max_epochs: int = 1000
    """Most passes over the training demos."""
    patience: int = 40
    """Stop after this many epochs without a better held-out error."""
    max_minutes: float | None = None
    """Stop after this many minutes of training (the best epoch so far is kept)."""
    batch_size: int = 256
    """Samples per gradient step."""
    learning_rate: float = 1e-3
    """Adam learning rate."""
    weight_decay: float = 0.0
    """Adam(W) weight decay."""
    val_fraction: float = 0.2
    """Fraction of the demos (whole episodes) held out to measure the action error."""
    heldout: Literal["random", "last"] = "random"
    """Which demos are held out: drawn with --seed, or the file's last ones (the split
    then does not change with the seed; only the network init and minibatch order do)."""
    min_std: float = 0.01
    """Floor of the normaliser's per-feature std: a feature (nearly) constant over the
    demos must not become a huge input when it moves a little at test time."""
    max_demos: int | None = None
    """Use at most this many demos of the file."""
    seed: int = 0
    """Seed of the split, the network init and the minibatch order."""
    device: str = "cpu"
    """Torch device."""
    torch_threads: int = 1
    """Torch CPU threads."""
    eval_init_states: str = ""
    """LIBERO init states to evaluate the cloned policy on, e.g. '30:50' (empty: none).
    The task is the one the demo file names."""
    eval_num_envs: int = 2
    """Env workers for the evaluation."""


@dataclass
class BCResult:
    """Outcome of `train_bc`.

    Attributes:
        checkpoint: Path of the BC checkpoint written.
        metrics: ``train_mse``, ``heldout_mse`` (mean squared action error per action
            element on held-out demos, at the best epoch), ``heldout_mse_baseline`` (the
            same for predicting the training demos' mean action), ``heldout_rmse_per_dim``
            (one per action dimension), ``best_epoch``, ``epochs``, ``train_samples``,
            ``heldout_samples``, ``train_demos``, ``heldout_demos``,
            ``heldout_demo_indices`` (positions in the demo file), ``wall_s``.
        curve: ``(epoch, train_mse, heldout_mse)`` per epoch.
        eval: LIBERO evaluation (``successes`` per init state, ``success_rate``) or None.
    """

    checkpoint: str
    metrics: dict[str, Any]
    curve: list[tuple[int, float, float]]
    eval: dict[str, Any] | None = None


def chunk_targets(actions: np.ndarray, chunk_size: int) -> np.ndarray:
    """Chunk targets of one episode: ``out[t, j] = actions[min(t + j, T - 1)]``.

    Args:
        actions: ``(T, A)``.
        chunk_size: ``K >= 1``.

    Returns:
        ``(T, K, A)``, the same dtype.

    Raises:
        ValueError: For ``chunk_size < 1`` or an empty episode.

    Examples:
        >>> chunk_targets(np.arange(3.0)[:, None], 2)[:, :, 0].tolist()
        [[0.0, 1.0], [1.0, 2.0], [2.0, 2.0]]
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected >= 1, got {chunk_size}")
    n = len(actions)
    if n == 0:
        raise ValueError("actions: an episode needs at least one step")
    index = np.minimum(np.arange(n)[:, None] + np.arange(chunk_size)[None, :], n - 1)
    return actions[index]


def _stack(
    demos: Sequence[Any], obs_keys: Sequence[str], chunk_size: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    obs = {k: np.concatenate([d.obs[k] for d in demos]).astype(np.float32) for k in obs_keys}
    targets = np.concatenate([chunk_targets(d.actions, chunk_size) for d in demos]).astype(
        np.float32
    )
    return obs, targets


def _spaces(
    observation_shapes: dict[str, list[int]], action_dim: int, chunk_size: int
) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    observation_space = gym.spaces.Dict(
        {
            k: gym.spaces.Box(-np.inf, np.inf, shape=tuple(shape), dtype=np.float32)
            for k, shape in observation_shapes.items()
        }
    )
    shape = (chunk_size, action_dim) if chunk_size > 1 else (action_dim,)
    return observation_space, gym.spaces.Box(-1.0, 1.0, shape=shape, dtype=np.float32)


def fit_normalizer(agent: ActorCritic, obs: dict[str, torch.Tensor], min_std: float) -> None:
    """Set the agent's observation statistics to those of ``obs`` (std floored at ``min_std``).

    Args:
        agent: An agent built with ``normalize_obs=True``.
        obs: Training observations, each ``(N, ...)``.
        min_std: Floor of the per-feature std.

    Raises:
        ValueError: If the agent has no normaliser.
    """
    if agent.obs_rms is None:
        raise ValueError("agent: built with normalize_obs=False, it has no normaliser to fit")
    state = agent.actor_encoder.state_vector(obs).double()
    agent.obs_rms.mean.copy_(state.mean(0))
    agent.obs_rms.var.copy_(state.var(0, unbiased=False).clamp_min(min_std**2))
    agent.obs_rms.count.fill_(float(len(state)))


def actor_mean(agent: ActorCritic, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The actor's mean action, flattened: ``(B, prod(action_shape))`` (no critic pass)."""
    return agent.actor_mean(agent.actor_encoder(obs))


def _mse(
    agent: ActorCritic, obs: dict[str, torch.Tensor], targets: torch.Tensor, batch: int = 4096
) -> float:
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(targets), batch):
            part = {k: v[start : start + batch] for k, v in obs.items()}
            mean = actor_mean(agent, part)
            total += float(((mean - targets[start : start + batch].reshape(mean.shape)) ** 2).sum())
    return total / max(1, targets.numel())


def actor_state_dict(agent: ActorCritic) -> dict[str, torch.Tensor]:
    """The actor's part of the agent's ``state_dict``: encoder, mean MLP, normaliser.

    The critic and the log standard deviation are left out (BC trains neither; the
    trainer's ``--init-log-std`` sets the latter).
    """
    return {
        k: v.detach().cpu().clone()
        for k, v in agent.state_dict().items()
        if not k.startswith(("critic.", "critic_encoder.")) and k != "actor_log_std"
    }


@dataclass
class _Split:
    """Demos split into training and held-out episodes, stacked as tensors."""

    heldout_indices: list[int]
    train_demos: int
    heldout_demos: int
    train_obs: dict[str, torch.Tensor]
    train_y: torch.Tensor  # (N, K * action_dim)
    val_obs: dict[str, torch.Tensor]
    val_y: torch.Tensor
    observation_shapes: dict[str, list[int]]
    action_dim: int


@dataclass
class _Fit:
    """The epoch loop's outcome: the best held-out error, its epoch and weights."""

    heldout_mse: float
    best_epoch: int
    best_state: dict[str, Any]
    epochs: int
    curve: list[tuple[int, float, float]]


def _check_config(config: BCConfig) -> None:
    if config.chunk_size < 1:
        raise ValueError(f"chunk_size: expected >= 1, got {config.chunk_size}")
    if not 0.0 < config.val_fraction < 1.0:
        raise ValueError(f"val_fraction: expected in (0, 1), got {config.val_fraction}")


def _split(demo_set: Any, config: BCConfig, device: torch.device) -> _Split:
    """Hold out whole episodes (the last ones or drawn with the seed), stack both parts."""
    if len(demo_set) < 2:
        raise ValueError(
            f"{config.demos}: {len(demo_set)} demo(s); BC needs >= 2 (one is held out)"
        )
    if config.heldout == "last":
        order = np.arange(len(demo_set))[::-1]
    else:
        order = np.random.default_rng(config.seed).permutation(len(demo_set))
    n_val = min(len(order) - 1, max(1, round(config.val_fraction * len(order))))
    val_demos = [demo_set.demos[i] for i in sorted(order[:n_val])]
    train_demos = [demo_set.demos[i] for i in sorted(order[n_val:])]
    train_obs_np, train_y_np = _stack(train_demos, config.obs_keys, config.chunk_size)
    val_obs_np, val_y_np = _stack(val_demos, config.obs_keys, config.chunk_size)

    def tensors(
        obs: dict[str, np.ndarray], y: np.ndarray
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return {k: torch.from_numpy(v).to(device) for k, v in obs.items()}, torch.from_numpy(
            y.reshape(len(y), -1)
        ).to(device)

    train_obs, train_y = tensors(train_obs_np, train_y_np)
    val_obs, val_y = tensors(val_obs_np, val_y_np)
    return _Split(
        heldout_indices=[int(i) for i in sorted(order[:n_val])],
        train_demos=len(train_demos),
        heldout_demos=len(val_demos),
        train_obs=train_obs,
        train_y=train_y,
        val_obs=val_obs,
        val_y=val_y,
        observation_shapes={k: list(v.shape[1:]) for k, v in train_obs_np.items()},
        action_dim=int(train_y_np.shape[-1]),
    )


def _fit(agent: ActorCritic, split: _Split, config: BCConfig, start: float) -> _Fit:
    """MSE epochs on the training demos until the held-out error stops improving for
    ``patience`` epochs, ``max_epochs`` or ``max_minutes`` (since ``start``)."""
    device = split.train_y.device
    params = list(agent.actor_mean.parameters()) + list(agent.actor_encoder.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    train_obs, train_y = split.train_obs, split.train_y
    best = (math.inf, 0, copy.deepcopy(agent.state_dict()))
    curve: list[tuple[int, float, float]] = []
    n = len(train_y)
    epoch = 0
    for epoch in range(1, config.max_epochs + 1):
        agent.train()
        perm = torch.randperm(n, generator=generator).to(device)
        for s in range(0, n, config.batch_size):
            idx = perm[s : s + config.batch_size]
            mean = actor_mean(agent, {k: v[idx] for k, v in train_obs.items()})
            loss = ((mean - train_y[idx]) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        agent.eval()
        train_mse = _mse(agent, train_obs, train_y)
        val_mse = _mse(agent, split.val_obs, split.val_y)
        curve.append((epoch, train_mse, val_mse))
        if val_mse < best[0]:
            best = (val_mse, epoch, copy.deepcopy(agent.state_dict()))
        elif epoch - best[1] >= config.patience:
            break
        if (
            config.max_minutes is not None
            and time.perf_counter() - start >= 60 * config.max_minutes
        ):
            break
    return _Fit(best[0], best[1], best[2], epoch, curve)


def _metrics(
    agent: ActorCritic, split: _Split, fit: _Fit, config: BCConfig, baseline: float, start: float
) -> dict[str, Any]:
    """`BCResult.metrics` of the agent at its best epoch."""
    val_y = split.val_y
    with torch.no_grad():
        pred = actor_mean(agent, split.val_obs).reshape(
            len(val_y), config.chunk_size, split.action_dim
        )
    per_dim = ((pred - val_y.reshape(pred.shape)) ** 2).mean(dim=(0, 1)).sqrt()
    return {
        "train_mse": _mse(agent, split.train_obs, split.train_y),
        "heldout_mse": fit.heldout_mse,
        "heldout_mse_baseline": baseline,
        "heldout_rmse_per_dim": [float(v) for v in per_dim],
        "best_epoch": fit.best_epoch,
        "epochs": fit.epochs,
        "train_demos": split.train_demos,
        "heldout_demos": split.heldout_demos,
        "heldout_demo_indices": split.heldout_indices,
        "train_samples": int(len(split.train_y)),
        "heldout_samples": int(len(val_y)),
        "wall_s": time.perf_counter() - start,
    }


def _evaluate_bc(
    agent: ActorCritic, demo_set: Any, config: BCConfig, device: torch.device
) -> dict[str, Any]:
    """The cloned policy on --eval-init-states of the task the demo file names."""
    from pipelined_vec_env.libero.collect import parse_init_states

    env_kwargs = demo_set.attrs.get("env_args", {}).get("env_kwargs", {})
    if "suite" not in env_kwargs or "task_id" not in env_kwargs:
        raise ValueError(
            f"{config.demos}: data/env_args names no LIBERO suite and task to evaluate on"
        )
    return evaluate_on_libero(
        agent,
        env_kwargs["suite"],
        int(env_kwargs["task_id"]),
        parse_init_states(config.eval_init_states),
        obs_keys=config.obs_keys,
        chunk_size=config.chunk_size,
        num_envs=config.eval_num_envs,
        device=device,
    )


def train_bc(config: BCConfig) -> BCResult:
    """Clone the demos into a fresh PPO actor, save it, optionally evaluate it on LIBERO.

    Steps: load and split the demos (whole episodes held out), fit the observation
    normaliser, MSE epochs with early stopping on the held-out error, keep the best
    epoch, save the checkpoint, evaluate.

    Args:
        config: The run configuration.

    Returns:
        The checkpoint path, the metrics (held-out action error at the best epoch and a
        mean-action baseline), the learning curve and the evaluation, if asked for.

    Raises:
        FileNotFoundError / ValueError: A missing or malformed demo file, missing
            observation keys, or fewer than 2 demos (one must be held out).
    """
    from pipelined_vec_env.libero.demos import load_demos

    _check_config(config)
    start = time.perf_counter()
    torch.set_num_threads(max(1, config.torch_threads))
    torch.manual_seed(config.seed)
    device = torch.device(config.device)
    demo_set = load_demos(config.demos, obs_keys=config.obs_keys, max_demos=config.max_demos)
    split = _split(demo_set, config, device)
    observation_space, action_space = _spaces(
        split.observation_shapes, split.action_dim, config.chunk_size
    )
    agent = ActorCritic(observation_space, action_space, hidden_sizes=config.hidden_sizes).to(
        device
    )
    fit_normalizer(agent, split.train_obs, config.min_std)
    baseline = float(((split.val_y - split.train_y.mean(0)) ** 2).mean())
    fit = _fit(agent, split, config, start)
    agent.load_state_dict(fit.best_state)
    agent.eval()
    metrics = _metrics(agent, split, fit, config, baseline, start)
    output = Path(config.output)
    save_checkpoint(
        output,
        {
            "format": BC_FORMAT,
            "version": 1,
            "actor": actor_state_dict(agent),
            "obs_keys": list(config.obs_keys),
            "observation_shapes": split.observation_shapes,
            "action_shape": list(action_space.shape),
            "chunk_size": config.chunk_size,
            "hidden_sizes": list(config.hidden_sizes),
            "metrics": metrics,
            "config": dataclasses.asdict(config),
            "demo_attrs": demo_set.attrs,
        },
    )
    logger.info(
        "BC: held-out action MSE %.4f (mean-action baseline %.4f) at epoch %d of %d, %.1f s",
        fit.heldout_mse,
        baseline,
        fit.best_epoch,
        fit.epochs,
        metrics["wall_s"],
    )
    result = BCResult(checkpoint=str(output), metrics=metrics, curve=fit.curve)
    if config.eval_init_states:
        result.eval = _evaluate_bc(agent, demo_set, config, device)
    return result


def _state_features(obs_keys: Sequence[str]) -> str:
    keys = set(obs_keys)
    if keys == {"goal_features"}:
        return "goal"
    if keys == {"state"}:
        return "full"
    if keys == {"goal_features", "state"}:
        return "both"
    raise ValueError(
        f"obs_keys: a LIBERO state policy reads goal_features and/or state, got {list(obs_keys)}"
    )


def _make_eval_env(
    suite: str, task_id: int, state_features: str, chunk_size: int, ids: tuple[int, ...]
) -> gym.Env:
    from pipelined_vec_env.libero.collect import InitStateCycle
    from pipelined_vec_env.libero.env import LiberoEnv
    from pipelined_vec_env.wrappers.action_chunk import ActionChunk

    env: gym.Env = InitStateCycle(LiberoEnv(suite, task_id, state_features=state_features), ids)
    return ActionChunk(env, chunk_size) if chunk_size > 1 else env


def evaluate_on_libero(
    agent: ActorCritic,
    suite: str,
    task_id: int,
    init_state_ids: Sequence[int],
    *,
    obs_keys: Sequence[str] = ("goal_features",),
    chunk_size: int = 1,
    num_envs: int = 2,
    device: torch.device | str = "cpu",
    step_timeout: float = 120.0,
) -> dict[str, Any]:
    """Deterministic success of ``agent`` from each init state, in parallel env workers.

    One episode per init state, through a `PipelinedVectorEnv` (same-step autoreset),
    env ``i`` running ``init_state_ids[i::num_envs]``; actions are the actor's mean
    (clipped to the action bounds).

    Args:
        agent: The policy.
        suite: LIBERO suite.
        task_id: Task index.
        init_state_ids: Init states, one episode each.
        obs_keys: Observation keys the agent reads (sets the env's ``state_features``).
        chunk_size: Actions per decision.
        num_envs: Env workers (capped at the number of init states).
        device: The policy device.
        step_timeout: Seconds one vector step may take.

    Returns:
        ``{"init_state_ids", "successes" (list of bool), "success_rate", "lengths"
        (primitive steps, an episode's last chunk counted whole), "wall_s"}``.

    Raises:
        ValueError: Empty ``init_state_ids`` or unsupported ``obs_keys``.
    """
    from pipelined_vec_env import PipelinedVectorEnv
    from reference_trainer.agent import obs_to_tensor

    ids = [int(k) for k in init_state_ids]
    if not ids:
        raise ValueError("init_state_ids: expected at least one id")
    features = _state_features(obs_keys)
    num_envs = max(1, min(num_envs, len(ids)))
    schedules = [tuple(ids[i::num_envs]) for i in range(num_envs)]
    fns = [
        functools.partial(_make_eval_env, suite, int(task_id), features, chunk_size, s)
        for s in schedules
    ]
    device = torch.device(device)
    start = time.perf_counter()
    results: dict[int, tuple[bool, int]] = {}
    envs = PipelinedVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        low, high = envs.single_action_space.low, envs.single_action_space.high
        obs, _ = envs.reset()
        episode, lengths = [0] * num_envs, [0] * num_envs
        active = np.ones(num_envs, dtype=bool)
        agent.eval()
        while active.any():
            with torch.no_grad():
                batch = obs_to_tensor({k: obs[k] for k in obs_keys}, device)
                actions = agent.act(batch, None).action.cpu().numpy()
            actions = np.clip(actions.reshape((num_envs, *low.shape)), low, high).astype(np.float32)
            envs.step_async(actions)
            obs, _, terminated, truncated, infos = envs.step_wait(timeout=step_timeout)
            executed = infos.get("chunk_steps_executed")
            reported = infos.get("_chunk_steps_executed")
            for i in np.flatnonzero(active):
                # an episode's last chunk reports in final_info (same-step autoreset): count it whole
                known = executed is not None and reported is not None and reported[i]
                lengths[i] += int(executed[i]) if known else chunk_size
                if terminated[i] or truncated[i]:
                    results[schedules[i][episode[i]]] = (bool(terminated[i]), lengths[i])
                    episode[i] += 1
                    lengths[i] = 0
                    active[i] = episode[i] < len(schedules[i])
    finally:
        envs.close()
    successes = [results[k][0] for k in ids]
    return {
        "init_state_ids": ids,
        "successes": successes,
        "success_rate": float(np.mean(successes)),
        "lengths": [results[k][1] for k in ids],
        "wall_s": time.perf_counter() - start,
    }


def main() -> None:
    """CLI: parse a `BCConfig` with tyro, clone, print the metrics (and evaluation)."""
    import tyro

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = tyro.cli(BCConfig)
    result = train_bc(config)
    out = {"checkpoint": result.checkpoint, **result.metrics}
    if result.eval is not None:
        out["eval_success_rate"] = result.eval["success_rate"]
        out["eval_successes"] = f"{sum(result.eval['successes'])}/{len(result.eval['successes'])}"
        out["eval_wall_s"] = result.eval["wall_s"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
