"""Checkpoints: everything needed to continue a run where it stopped.

A checkpoint holds the agent (weights and observation statistics), the optimiser, the
reward scaler, the iteration and env-step counters, the noise and minibatch generators,
the metric history and the config. Env states are not saved: a resumed run resets its
envs (with a seed derived from the iteration, so it does not replay the first episodes).
Writes go to a temporary file first and are renamed, so a crash never leaves a torn file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKPOINT_NAME", "find_checkpoint", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_NAME = "checkpoint.pt"


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
