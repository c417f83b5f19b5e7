"""Observations as torch tensors (`pipelined_vec_env.torch_observations`), on the CPU.

Each test reads a vector env of `CameraEnv` (two camera frames and a state) through
`TorchObservations` and compares with what the vector env returned and with each env
stepped alone: values, dtypes, shapes, which tensors are views of the shared buffers and
which are copies, and what a view shows after the next step. The device-copy path (what
runs on CUDA: page-locked buffers, non-blocking copies into new tensors, unregistered at
close) runs here with a recording registrar on the CPU; the CUDA test runs where a GPU is.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pipelined_vec_env.debug_envs import CameraEnv  # noqa: E402
from pipelined_vec_env.torch_observations import TorchObservations, as_tensors  # noqa: E402

from .conftest import camera_frames_alone  # noqa: E402

KEYS = ("camera0_image", "camera1_image", "state")


def camera_fns(n: int, side: int = 16) -> list:
    return [lambda: CameraEnv(side=side, state_size=5) for _ in range(n)]


def alone(n: int, steps: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Env ``k`` alone, reset with ``seed + k`` and stepped ``steps`` times: its last obs."""
    return camera_frames_alone(n, steps, seed, side=16, state_size=5)


def assert_batch(tensors: dict, expected: dict[str, np.ndarray]) -> None:
    assert list(tensors) == list(KEYS)
    for key in KEYS:
        assert tensors[key].dtype == torch.from_numpy(expected[key]).dtype
        assert tuple(tensors[key].shape) == expected[key].shape
        np.testing.assert_array_equal(tensors[key].cpu().numpy(), expected[key])


def stacked(items: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.stack([item[key] for item in items]) for key in KEYS}


class RecordingRegistrar:
    """Records register/unregister calls; at unregister, notes whether the segments
    behind the buffers still exist (they must: unregister comes before unmapping)."""

    def __init__(self, names: list[str], fail: bool = False) -> None:
        self.names, self.fail = names, fail
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []
        self.segments_alive_at_unregister: list[bool] = []

    def register(self, pointer: int, nbytes: int) -> None:
        if self.fail:
            raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")
        self.registered.append((pointer, nbytes))

    def unregister(self, pointer: int) -> None:
        self.unregistered.append(pointer)
        alive = all(os.path.exists(f"/dev/shm/{name}") for name in self.names)
        self.segments_alive_at_unregister.append(alive)


def test_cpu_views_hold_the_step_observations_without_a_copy(make_pipelined):
    envs = make_pipelined(camera_fns(4), envs_per_worker=2, copy=False)
    to_torch = TorchObservations(envs)
    envs.reset(seed=0)
    obs = envs.step(np.zeros((4, 7), np.float32))[0]
    tensors = to_torch.batch()

    assert_batch(tensors, stacked(alone(4, 1)))
    shared = envs.shared_observations
    for key in KEYS:  # views of the shared buffers, as the copy=False step's arrays are
        assert tensors[key].data_ptr() == shared[key].ctypes.data == obs[key].ctypes.data
    assert to_torch.copy is False and to_torch.pinned is False


def test_a_cpu_view_shows_the_next_step_and_a_copy_does_not(make_pipelined):
    envs = make_pipelined(camera_fns(2), copy=False)
    views = TorchObservations(envs)
    copies = TorchObservations(envs, copy=True)
    envs.reset(seed=0)
    envs.step(np.zeros((2, 7), np.float32))
    view, copy = views.batch(), copies.batch()
    assert copy["camera0_image"].data_ptr() != view["camera0_image"].data_ptr()

    envs.step(np.zeros((2, 7), np.float32))

    assert_batch(view, stacked(alone(2, 2)))  # the workers wrote the second step there
    assert_batch(copy, stacked(alone(2, 1)))  # the copy keeps the first
    assert view["state"][:, 0].tolist() == [2.0, 2.0]


def test_staged_steps_read_their_stage_rows(make_pipelined):
    envs = make_pipelined(camera_fns(4), num_stages=2, copy=False)
    to_torch = TorchObservations(envs)
    envs.reset(seed=0)
    envs.step_async(np.zeros((2, 7), np.float32), stage=1)
    obs = envs.step_wait(stage=1)[0]

    tensors = to_torch.batch(stage=1)

    assert_batch(tensors, {key: np.asarray(obs[key]) for key in KEYS})
    assert_batch(tensors, stacked(alone(4, 1)[2:]))
    assert tensors["state"].data_ptr() == envs.shared_observations["state"][2:].ctypes.data
    assert_batch(to_torch.batch(slice(0, 2)), stacked(alone(4, 0)[:2]))  # stage 0: reset


def test_recv_rows_follow_env_id_order(make_pipelined):
    envs = make_pipelined(camera_fns(4), envs_per_worker=1)
    to_torch = TorchObservations(envs)
    envs.async_reset(seed=0)
    obs, *_, infos = envs.recv(batch_size=4)
    ids = infos["env_id"]

    tensors = to_torch.rows(ids)

    assert_batch(tensors, {key: np.asarray(obs[key]) for key in KEYS})
    reordered = to_torch.rows([3, 1])  # not one run: an indexed copy, in the order asked
    assert_batch(reordered, stacked([alone(4, 0)[3], alone(4, 0)[1]]))
    run = to_torch.rows([1, 2])  # one run of consecutive envs: views
    assert (
        run["camera1_image"].data_ptr() == envs.shared_observations["camera1_image"][1:].ctypes.data
    )


def test_device_copies_register_the_buffers_and_unregister_before_unmapping(make_pipelined):
    envs = make_pipelined(camera_fns(4), envs_per_worker=2, copy=False)
    registrar = RecordingRegistrar(envs.shared_memory_names)
    to_torch = TorchObservations(envs, copy=True, registrar=registrar)
    shared = envs.shared_observations
    leaves = [shared[key] for key in KEYS]
    assert registrar.registered == [(a.ctypes.data, a.nbytes) for a in leaves]
    assert to_torch.pinned
    envs.reset(seed=0)
    envs.step(np.zeros((4, 7), np.float32))

    tensors = to_torch.batch()
    rows = to_torch.rows([3, 0, 1])

    assert_batch(tensors, stacked(alone(4, 1)))
    first = alone(4, 1)
    assert_batch(rows, stacked([first[3], first[0], first[1]]))
    for key in KEYS:  # new tensors, not the buffers
        assert not np.shares_memory(tensors[key].numpy(), shared[key])
    envs.close()
    assert registrar.unregistered == [a.ctypes.data for a in leaves]
    assert registrar.segments_alive_at_unregister == [True] * len(leaves)
    assert not to_torch.pinned


def test_a_failed_registration_copies_unpinned(make_pipelined, caplog):
    envs = make_pipelined(camera_fns(2), copy=False)
    registrar = RecordingRegistrar(envs.shared_memory_names, fail=True)
    to_torch = TorchObservations(envs, copy=True, registrar=registrar)
    assert not to_torch.pinned and "could not page-lock" in caplog.text
    envs.reset(seed=3)
    assert_batch(to_torch.batch(), stacked(alone(2, 0, seed=3)))


def test_bad_arguments_are_named(make_pipelined):
    envs = make_pipelined(camera_fns(2), num_stages=2)
    to_torch = TorchObservations(envs)
    with pytest.raises(ValueError, match="stage"):
        to_torch.batch(stage=2)
    with pytest.raises(ValueError, match="env_ids"):
        to_torch.rows([0, 2])
    with pytest.raises(ValueError, match="env_ids"):
        to_torch.rows([[0, 1]])
    piped = make_pipelined(camera_fns(2), shared_memory=False)
    with pytest.raises(ValueError, match="shared memory"):
        TorchObservations(piped)


def test_reads_after_close_raise_gymnasiums_closed_error(make_pipelined):
    from gymnasium.error import ClosedEnvironmentError

    envs = make_pipelined(camera_fns(2), copy=False)
    to_torch = TorchObservations(envs)
    envs.reset(seed=0)
    envs.close()
    with pytest.raises(ClosedEnvironmentError):
        to_torch.batch()
    assert envs.shared_observations is None


def test_as_tensors_keeps_the_layout_and_shares_memory_on_the_cpu():
    obs = {"image": np.arange(24, dtype=np.uint8).reshape(2, 3, 4), "parts": (np.ones(2),)}
    tensors = as_tensors(obs, "cpu")
    assert tensors["image"].dtype == torch.uint8 and tensors["parts"][0].dtype == torch.float64
    assert tensors["image"].data_ptr() == obs["image"].ctypes.data
    flipped = as_tensors(obs["image"][:, ::-1], "cpu")  # negative strides: a copy
    np.testing.assert_array_equal(flipped.numpy(), obs["image"][:, ::-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_uploads_from_pinned_buffers(make_pipelined):  # pragma: no cover - needs a GPU
    envs = make_pipelined(camera_fns(4), copy=False)
    to_torch = TorchObservations(envs, device="cuda")
    assert to_torch.pinned
    envs.reset(seed=0)
    envs.step(np.zeros((4, 7), np.float32))
    tensors = to_torch.batch()
    assert tensors["camera0_image"].device.type == "cuda"
    assert_batch(tensors, stacked(alone(4, 1)))
    assert torch.from_numpy(envs.shared_observations["camera0_image"]).is_pinned()
    envs.close()
    assert not to_torch.pinned


def test_the_reference_trainers_conversion_shares_frames_and_casts_states():
    from reference_trainer.agent import obs_to_tensor

    obs = {"image": np.zeros((2, 4, 4, 3), np.uint8), "state": np.ones((2, 3), np.float64)}
    tensors = obs_to_tensor(obs, torch.device("cpu"))
    assert tensors["image"].dtype == torch.uint8 and tensors["state"].dtype == torch.float32
    assert tensors["image"].data_ptr() == obs["image"].ctypes.data  # no copy of the frames
    np.testing.assert_array_equal(tensors["state"].numpy(), obs["state"])
