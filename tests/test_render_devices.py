"""``render_devices`` names CUDA ids; each worker maps its id to EGL's index of that device
(``EGL_CUDA_DEVICE_NV``), honouring ``CUDA_VISIBLE_DEVICES``. EGL's device list is faked here
(no GPU on the test machines); a real worker on a machine without one keeps the CUDA id."""

from __future__ import annotations

import logging
import os

import pytest

from pipelined_vec_env.debug_envs import CountingEnv
from pipelined_vec_env.workers import render_devices
from pipelined_vec_env.workers.render_devices import (
    RenderDeviceEnvFn,
    egl_index_for,
    physical_cuda_id,
    resolve_render_devices,
)

#: A node where CUDA devices 0-3 are EGL devices 2, 3, 0, 1 (EGL device k has CUDA ordinal
#: EGL_ORDINALS[k]), plus Mesa's software device (no CUDA ordinal) last.
EGL_ORDINALS = [2, 3, 0, 1, None]


@pytest.mark.parametrize(("cuda", "egl"), [(0, 2), (1, 3), (2, 0), (3, 1)])
def test_cuda_ids_map_to_egl_indices(cuda: int, egl: int) -> None:
    assert egl_index_for(cuda, EGL_ORDINALS, None) == egl


@pytest.mark.parametrize(("cuda", "egl"), [(0, 0), (1, 1)])
def test_cuda_visible_devices_renumbers_cuda_not_egl(cuda: int, egl: int) -> None:
    # CUDA_VISIBLE_DEVICES=2,3: this process's CUDA 0 and 1 are the node's GPUs 2 and 3,
    # EGL devices 0 and 1 on this node
    assert physical_cuda_id(cuda, "2,3") == cuda + 2
    assert egl_index_for(cuda, EGL_ORDINALS, "2,3") == egl


@pytest.mark.parametrize("visible", ["GPU-8f6c1a52-aaaa-bbbb-cccc-0123456789ab", "", "5"])
def test_what_cannot_be_mapped_is_none(visible: str) -> None:
    # a UUID entry, an id past the visible devices, a GPU EGL does not list
    assert egl_index_for(1 if visible == "" else 0, EGL_ORDINALS, visible) is None


def _worker_env(
    monkeypatch: pytest.MonkeyPatch, device: int, ordinals: list[int | None] | None
) -> str:
    """What `RenderDeviceEnvFn` sets in a worker whose EGL lists ``ordinals``."""
    for var in ("MUJOCO_EGL_DEVICE_ID", "EGL_DEVICE_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(render_devices, "egl_cuda_ordinals", lambda: ordinals)
    RenderDeviceEnvFn(lambda: CountingEnv(0), device)()
    assert os.environ["EGL_DEVICE_ID"] == os.environ["MUJOCO_EGL_DEVICE_ID"]
    return os.environ["MUJOCO_EGL_DEVICE_ID"]


def test_a_worker_sets_the_egl_index_of_its_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [_worker_env(monkeypatch, d, EGL_ORDINALS) for d in range(4)] == ["2", "3", "0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [_worker_env(monkeypatch, d, EGL_ORDINALS) for d in range(2)] == ["0", "1"]


def test_without_a_mapping_the_cuda_id_is_kept_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(render_devices, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=render_devices.__name__):
        assert _worker_env(monkeypatch, 3, [None]) == "3"  # Mesa's software device only
        assert _worker_env(monkeypatch, 1, [None]) == "1"
        assert _worker_env(monkeypatch, 2, None) == "2"  # no EGL device enumeration
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "none with a CUDA ordinal" in messages[0] and "CUDA id itself" in messages[0]


def test_auto_is_every_visible_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert resolve_render_devices("auto") == (0, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_render_devices("auto") is None
    assert resolve_render_devices((3, 1)) == (3, 1)


def test_workers_on_a_machine_without_a_cuda_egl_device_keep_the_ids(make_pipelined) -> None:
    from .test_diagnostics import DeviceEnv

    fns = [lambda i=i: DeviceEnv(i) for i in range(2)]
    envs = make_pipelined(fns, envs_per_worker=1, render_devices=[1, 0])
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("an NVIDIA GPU is here: its EGL may map the ids")
    assert envs.get_attr("seen") == ("1", "0")
