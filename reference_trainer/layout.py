"""``--num-stages auto``: choose the rollout layout with `pipelined_vec_env.tune` before training.

`resolve_layout` measures the trainer's own envs and its own inference (a fresh
``ActorCritic`` of the configured size on the configured device, normalisation included)
and returns the config with the chosen ``num_stages``, ``envs_per_worker`` and
``worker_nice`` (tune varies it only where CPU-bound envs oversubscribe the cores and
``--worker-nice`` is not given); a decoupled
choice turns ``decoupled`` on with one inference actor. tune models a single caller
thread, which is what the staged collector is and what a one-actor decoupled collector
comes closest to (the channel's actor batches whatever is posted, ``rollout_queue_size``
0 and ``max_wait`` 0: its batches are not tune's fixed ``recv`` batch, see docs/tune.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from reference_trainer.agent import ActorCritic, obs_to_tensor
from reference_trainer.config import TrainConfig
from reference_trainer.envs import EnvFactory

__all__ = ["fixed_num_stages", "resolve_layout"]


def resolve_layout(
    config: TrainConfig, factory: EnvFactory, device: torch.device
) -> tuple[TrainConfig, dict[str, Any] | None]:
    """Resolve ``num_stages="auto"`` by running `pipelined_vec_env.tune`.

    Args:
        config: The run's config; returned unchanged unless ``num_stages == "auto"``.
        factory: Builds the envs (the same constructors training uses).
        device: The policy's device.

    Returns:
        ``(config, record)``: the config with ``num_stages``, ``envs_per_worker``,
        ``worker_nice``, ``decoupled`` (and ``num_actors=1``, ``rollout_queue_size=0``, ``max_wait=0`` when
        decoupled) set from the choice, and a JSON-ready record of it (mode, kwargs,
        batch size, predicted and measured steps/s, the table, the measurements), or None
        when nothing was tuned.

    Raises:
        ValueError: ``num_stages="auto"`` with ``backend="ray"`` (tune runs local workers).
    """
    if config.num_stages != "auto":
        return config, None
    if config.backend != "multiprocessing":
        raise ValueError("num_stages: 'auto' needs backend='multiprocessing'")
    from pipelined_vec_env import tune

    probe = factory.env_fn(0)()
    try:
        agent = ActorCritic.from_config(config, probe.observation_space, probe.action_space)
        agent = agent.to(device)
        low, high = probe.action_space.low, probe.action_space.high
    finally:
        probe.close()
    agent.eval()

    @torch.no_grad()
    def policy(obs: Any) -> np.ndarray:
        tensor = obs_to_tensor(obs, device)
        n = len(next(iter(tensor.values())) if isinstance(tensor, dict) else tensor)
        noise = torch.zeros((n, agent.action_dim), device=device)
        actions = agent.act(tensor, noise).action.cpu().numpy()
        return np.clip(actions, low, high)

    threads = torch.get_num_threads()
    torch.set_num_threads(config.resolved_torch_threads(config.num_envs))
    try:
        result = tune(
            [factory.env_fn(i) for i in range(config.num_envs)],
            policy,
            max_seconds=config.tune_seconds,
            seed=config.seed,
            env_kwargs={
                "autoreset_mode": AutoresetMode.SAME_STEP,
                **({} if config.worker_nice is None else {"worker_nice": config.worker_nice}),
            },
        )
    finally:
        torch.set_num_threads(threads)
    changes: dict[str, Any] = {
        "num_stages": int(result.kwargs["num_stages"]),
        "envs_per_worker": int(result.kwargs["envs_per_worker"]),
        "decoupled": result.mode == "decoupled",
        "worker_nice": result.kwargs.get("worker_nice"),  # tune's choice, or the config's
    }
    if result.mode == "decoupled":
        changes.update(num_actors=1, rollout_queue_size=0, max_wait=0.0)
    else:
        changes.update(pipelined=True, stage_order="round_robin")
    name = next(
        row["name"]
        for row in result.table
        if row["mode"] == result.mode
        and row["batch_size"] == result.batch_size
        and row["kwargs"] == result.kwargs
    )
    print(f"--num-stages auto: tune chose {name} in {result.seconds:.1f} s")
    print(result.format_table())
    record = {
        "choice": name,
        "mode": result.mode,
        "kwargs": {
            k: v for k, v in result.kwargs.items() if k in ("num_stages", "envs_per_worker")
        },
        "batch_size": result.batch_size,
        "predicted_steps_per_s": result.predicted_steps_per_s,
        "measured_steps_per_s": result.measured_steps_per_s,
        "seconds": result.seconds,
        "table": [
            {**row, "kwargs": {k: v for k, v in row["kwargs"].items() if k != "autoreset_mode"}}
            for row in result.table
        ],
        "measurements": result.measurements,
    }
    return dataclasses.replace(config, **changes), record


def fixed_num_stages(config: TrainConfig) -> int:
    """Stages of the vector envs outside training (demos, a checkpoint's evaluation):
    ``config.num_stages``, or 2 with "auto" (tune measures the training loop only)."""
    return config.num_stages if isinstance(config.num_stages, int) else 2
