"""A GPU per worker for headless rendering (EGL), named by its CUDA id, set before the worker
builds its envs.

MuJoCo's EGL backend renders on the device ``MUJOCO_EGL_DEVICE_ID`` names: an index into
EGL's own list of devices (``eglQueryDevicesEXT``). That list need not follow CUDA's
numbering (a node may have CUDA devices 0-3 as EGL devices 2, 3, 0, 1), and
``CUDA_VISIBLE_DEVICES`` (Ray, SLURM, ``docker --gpus``) renumbers CUDA's devices but not
EGL's (mujoco#3245). So ``render_devices`` names CUDA ids as torch sees them, and each
worker resolves the EGL device whose ``EGL_CUDA_DEVICE_NV`` attribute (EGL_NV_device_cuda)
is that device's ordinal among all of the node's GPUs: the entry of ``CUDA_VISIBLE_DEVICES``
at that id where it is set, the id itself where it is not. Where it cannot map (no EGL
device extension, no NVIDIA EGL device, ``CUDA_VISIBLE_DEVICES`` naming devices by UUID) it
says so once per worker and sets the CUDA id itself, as before. The same method as RLinf's
and CALVIN's EGL device lookup. `RenderDeviceEnvFn` wraps a worker's first env constructor,
so this runs inside the worker process, at start-up and at every rebuild.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import Env

__all__ = [
    "EGL_CUDA_DEVICE_NV",
    "RENDER_DEVICE_VARS",
    "RenderDeviceEnvFn",
    "check_render_devices",
    "egl_cuda_ordinals",
    "egl_index_for",
    "physical_cuda_id",
    "resolve_render_devices",
    "visible_cuda_count",
]

logger = logging.getLogger(__name__)

#: Variables set per worker: the device, and EGL as the backend where none is chosen.
RENDER_DEVICE_VARS = ("MUJOCO_EGL_DEVICE_ID", "EGL_DEVICE_ID", "MUJOCO_GL", "PYOPENGL_PLATFORM")
#: ``eglQueryDeviceAttribEXT`` attribute of EGL_NV_device_cuda: the device's CUDA ordinal.
EGL_CUDA_DEVICE_NV = 0x323A

_warned: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def check_render_devices(render_devices: Any) -> tuple[int, ...] | str | None:
    """Validate ``render_devices``: None, ``"auto"``, or a non-empty sequence or 1-d numpy
    array of CUDA ids >= 0.

    Raises:
        ValueError: Anything else (before any worker starts).
    """
    if render_devices is None or (isinstance(render_devices, str) and render_devices == "auto"):
        return render_devices
    bad = ValueError(
        "render_devices: expected None, 'auto' or a non-empty sequence of CUDA ids "
        f"(ints >= 0), got {render_devices!r}"
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


def visible_cuda_count() -> int:
    """CUDA devices this process sees: the entries of ``CUDA_VISIBLE_DEVICES`` where it is
    set, else ``torch.cuda.device_count()`` where torch is installed, else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return int(torch.cuda.device_count())


def resolve_render_devices(render_devices: tuple[int, ...] | str | None) -> tuple[int, ...] | None:
    """``"auto"``: every CUDA device the caller sees, round-robin (`visible_cuda_count`);
    none seen: None (rendering left as it is, said once). Others are returned as given."""
    if render_devices != "auto":
        return render_devices  # type: ignore[return-value]
    count = visible_cuda_count()
    if count == 0:
        _say_once("render_devices='auto': no CUDA device is visible; rendering is left as it is")
        return None
    return tuple(range(count))


def physical_cuda_id(cuda_id: int, visible: str | None) -> int | None:
    """The node-wide ordinal of CUDA device ``cuda_id`` as this process numbers it, under
    ``CUDA_VISIBLE_DEVICES=visible`` (None: unset). None where ``visible`` names devices by
    UUID (``GPU-...``, ``MIG-...``) or has no entry ``cuda_id``."""
    if visible is None:
        return cuda_id
    entries = [d.strip() for d in visible.split(",") if d.strip()]
    if cuda_id >= len(entries) or not entries[cuda_id].isdigit():
        return None
    return int(entries[cuda_id])


def egl_index_for(
    cuda_id: int, egl_ordinals: Sequence[int | None], visible: str | None
) -> int | None:
    """The index in EGL's device list of CUDA device ``cuda_id`` (as this process numbers it).

    Args:
        cuda_id: CUDA id as torch sees it (after ``CUDA_VISIBLE_DEVICES``).
        egl_ordinals: Per EGL device, in EGL's order, its ``EGL_CUDA_DEVICE_NV`` (None for a
            device without one, e.g. Mesa's software device); see `egl_cuda_ordinals`.
        visible: ``CUDA_VISIBLE_DEVICES`` (None: unset).

    Returns:
        The EGL index, or None where no EGL device is that CUDA device.

    Examples:
        >>> egl_index_for(0, [2, 3, 0, 1], None)  # CUDA 0-3 are EGL 2, 3, 0, 1
        2
        >>> egl_index_for(1, [2, 3, 0, 1], "2,3")  # CUDA 1 here is the node's GPU 3
        1
    """
    physical = physical_cuda_id(cuda_id, visible)
    if physical is None:
        return None
    for index, ordinal in enumerate(egl_ordinals):
        if ordinal == physical:
            return index
    return None


def egl_cuda_ordinals() -> list[int | None] | None:
    """Each EGL device's CUDA ordinal (``EGL_CUDA_DEVICE_NV``), in EGL's order; None where
    EGL's device enumeration cannot be used here (no EGL, no EGL_EXT_device_query)."""
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    try:
        import ctypes

        from mujoco.egl import egl_ext as egl

        devices = egl.eglQueryDevicesEXT(max_devices=64)
        address = egl.eglGetProcAddress("eglQueryDeviceAttribEXT")
        if not address:
            return None
        query = ctypes.CFUNCTYPE(
            egl.EGLBoolean, egl.EGLDeviceEXT, egl.EGLint, ctypes.POINTER(ctypes.c_ssize_t)
        )(address)
    except Exception as exc:  # ImportError, GLError, no libEGL: nothing to map with
        logger.debug("no EGL device enumeration: %r", exc)
        return None
    ordinals: list[int | None] = []
    for device in devices:
        value = ctypes.c_ssize_t(-1)
        ok = query(device, EGL_CUDA_DEVICE_NV, ctypes.byref(value))
        ordinals.append(int(value.value) if ok and value.value >= 0 else None)
    return ordinals


def egl_device_for(cuda_id: int) -> int | None:
    """The EGL index of CUDA device ``cuda_id`` in this process, or None (said once) where
    it cannot be mapped."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ordinals = egl_cuda_ordinals()
    if ordinals is None or not any(o is not None for o in ordinals):
        _say_once(
            f"render_devices: EGL here lists no CUDA device (EGL_NV_device_cuda: "
            f"{'no EGL device enumeration' if ordinals is None else f'{len(ordinals)} devices, none with a CUDA ordinal'}); "
            "MUJOCO_EGL_DEVICE_ID is set to the CUDA id itself"
        )
        return None
    index = egl_index_for(cuda_id, ordinals, visible)
    if index is None:
        _say_once(
            f"render_devices: CUDA device {cuda_id} (CUDA_VISIBLE_DEVICES={visible!r}) is "
            f"none of EGL's devices (their CUDA ordinals: {ordinals}); MUJOCO_EGL_DEVICE_ID "
            "is set to the CUDA id itself"
        )
    return index


class RenderDeviceEnvFn:
    """An env constructor that first points its worker's EGL rendering at one GPU.

    Sets ``MUJOCO_EGL_DEVICE_ID`` and ``EGL_DEVICE_ID`` to the EGL index of CUDA device
    ``device`` (`egl_device_for`; where it cannot be mapped, to ``device`` itself), and
    ``MUJOCO_GL`` / ``PYOPENGL_PLATFORM`` to ``"egl"`` where they are unset.

    Args:
        env_fn: The real constructor.
        device: CUDA id, as torch sees it in the caller.
    """

    def __init__(self, env_fn: Any, device: int) -> None:
        self.env_fn = env_fn
        self.device = device

    def __call__(self) -> Env:
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
        index = egl_device_for(self.device)
        egl = str(self.device if index is None else index)
        os.environ["MUJOCO_EGL_DEVICE_ID"] = egl
        os.environ["EGL_DEVICE_ID"] = egl
        return self.env_fn()
