"""Checkpoints: everything needed to continue a run, and warm starts from BC or a run.

A trainer checkpoint holds the agent (weights and observation statistics), the optimiser, the
reward scaler, the iteration and env-step counters, the noise and minibatch generators,
the metric history and the config. Env states are not saved: a resumed run resets its
envs (with a seed derived from the iteration, so it does not replay the first episodes).
Writes go to a temporary file first and are renamed, so a crash never leaves a torn file.

A BC checkpoint (`reference_trainer.bc`, ``format == BC_FORMAT``) holds only the actor:
its encoder, mean MLP and observation normaliser. `load_init_checkpoint` starts a fresh
agent from either kind (``--init-checkpoint``): weights only, no optimiser or counters.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "BC_FORMAT",
    "CHECKPOINT_NAME",
    "find_checkpoint",
    "load_checkpoint",
    "load_init_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_NAME = "checkpoint.pt"

BC_FORMAT = "pipelined-vec-env/bc-actor"
"""The ``format`` entry of a BC checkpoint written by `reference_trainer.bc`."""


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomically write ``state`` to ``path`` with ``torch.save``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def find_checkpoint(location: str | os.PathLike[str]) -> Path:
    """Resolve ``location`` (a checkpoint file or a run directory) to a checkpoint file.

    Raises:
        FileNotFoundError: if there is no checkpoint there.
    """
    path = Path(location)
    if path.is_dir():
        path = path / "checkpoints" / CHECKPOINT_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; pass a checkpoint file or a run dir")
    return path


def load_checkpoint(location: str | os.PathLike[str], device: torch.device) -> dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint`, tensors mapped to ``device``.

    Raises:
        FileNotFoundError: if there is no checkpoint at ``location``.
    """
    return torch.load(find_checkpoint(location), map_location=device, weights_only=False)


def load_init_checkpoint(
    agent: nn.Module, location: str | os.PathLike[str], device: torch.device
) -> dict[str, Any]:
    """Start ``agent`` from a BC checkpoint or a trainer checkpoint (weights only).

    A BC checkpoint sets the actor (encoder, mean MLP) and the observation normaliser;
    the critic and the log standard deviation keep their fresh initialisation. A trainer
    checkpoint sets the whole agent: actor, log std, normaliser and critic. Optimiser,
    counters and generators are never loaded (that is ``--resume``).

    Args:
        agent: A freshly built `ActorCritic`.
        location: A checkpoint file, or a run directory (its ``checkpoints/checkpoint.pt``).
        device: Where to map the tensors.

    Returns:
        ``{"path", "kind" ("bc" or "trainer"), "loaded" (state-dict keys set),
        "metrics" (a BC checkpoint's metrics, else None)}``.

    Raises:
        FileNotFoundError: No checkpoint at ``location``.
        ValueError: Neither kind, or weights that do not fit the agent (different
            observation keys, hidden sizes, action or chunk shape), naming what differs.
    """
    path = find_checkpoint(location)
    state = torch.load(path, map_location=device, weights_only=False)
    if isinstance(state, dict) and state.get("format") == BC_FORMAT:
        kind, weights = "bc", state["actor"]
        encoder = getattr(agent, "actor_encoder", None)
        keys = getattr(encoder, "state_keys", None)
        # a Box observation is one unnamed entry: any single BC key maps onto it
        box = encoder is not None and not encoder.is_dict and len(state.get("obs_keys", [])) == 1
        if keys is not None and not box and list(state.get("obs_keys", keys)) != list(keys):
            raise ValueError(
                f"--init-checkpoint {path}: the BC actor reads observation keys "
                f"{state['obs_keys']}, this env gives {keys}; build the env with the same "
                "observation (LIBERO: the same state_features)"
            )
    elif isinstance(state, dict) and "agent" in state:
        kind, weights = "trainer", state["agent"]
    else:
        raise ValueError(
            f"--init-checkpoint {path}: neither a BC checkpoint (format {BC_FORMAT!r}) nor "
            "a trainer checkpoint (with an 'agent' entry)"
        )
    own = agent.state_dict()
    unknown = sorted(k for k in weights if k not in own)
    wrong = [
        f"{k}: checkpoint {tuple(v.shape)}, agent {tuple(own[k].shape)}"
        for k, v in weights.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    if unknown or wrong:
        hint = ""
        if kind == "bc":
            hint = (
                f" (the BC actor has hidden sizes {state.get('hidden_sizes')}, action shape "
                f"{state.get('action_shape')}, observation {state.get('observation_shapes')}:"
                " match --hidden-sizes, --chunk-size and the observation)"
            )
        raise ValueError(
            f"--init-checkpoint {path} does not fit this agent{hint}: "
            + "; ".join(wrong + [f"{k}: not in the agent" for k in unknown])
        )
    agent.load_state_dict(weights, strict=False)
    return {
        "path": str(path),
        "kind": kind,
        "loaded": sorted(weights),
        "metrics": state.get("metrics") if kind == "bc" else None,
    }
