"""A GPU per worker for headless rendering (EGL), set before the worker builds its envs.

MuJoCo's EGL backend renders on the device ``MUJOCO_EGL_DEVICE_ID`` names (an index
into the EGL devices, which follows CUDA's numbering where ``CUDA_VISIBLE_DEVICES`` is
unset). `RenderDeviceEnvFn` wraps a worker's first env constructor so that the variables
are set inside the worker process, at start-up and at every rebuild.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import Env

__all__ = ["RENDER_DEVICE_VARS", "RenderDeviceEnvFn", "check_render_devices"]

#: Variables set per worker: the device, and EGL as the backend where none is chosen.
RENDER_DEVICE_VARS = ("MUJOCO_EGL_DEVICE_ID", "EGL_DEVICE_ID", "MUJOCO_GL", "PYOPENGL_PLATFORM")


def check_render_devices(render_devices: Any) -> tuple[int, ...] | None:
    """Validate ``render_devices`` (None, or a non-empty sequence or 1-d numpy array of GPU
    ids >= 0).

    Raises:
        ValueError: Anything else (before any worker starts).
    """
    if render_devices is None:
        return None
    bad = ValueError(
        "render_devices: expected None or a non-empty sequence of GPU ids (ints >= 0), "
        f"got {render_devices!r}"
    )
    one_dim_array = isinstance(render_devices, np.ndarray) and render_devices.ndim == 1
    if isinstance(render_devices, (str, bytes)) or not (
        isinstance(render_devices, Sequence) or one_dim_array
    ):
        raise bad
    ids = tuple(render_devices)
    if not ids or any(
        isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in ids
    ):
        raise bad
    return tuple(int(d) for d in ids)


class RenderDeviceEnvFn:
    """An env constructor that first points its worker's EGL rendering at one GPU.

    Sets ``MUJOCO_EGL_DEVICE_ID`` and ``EGL_DEVICE_ID`` to ``device``, and
    ``MUJOCO_GL`` / ``PYOPENGL_PLATFORM`` to ``"egl"`` where they are unset.

    Args:
        env_fn: The real constructor.
        device: GPU id.
    """

    def __init__(self, env_fn: Any, device: int) -> None:
        self.env_fn = env_fn
        self.device = device

    def __call__(self) -> Env:
        os.environ["MUJOCO_EGL_DEVICE_ID"] = str(self.device)
        os.environ["EGL_DEVICE_ID"] = str(self.device)
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
        return self.env_fn()
