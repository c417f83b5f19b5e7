"""Copying steps of camera frames return views of a generation of the shared buffers
(`pipelined_vec_env.observation_ring`): what the caller holds is never written again, a
batch it dropped is, and every batch equals each env stepped alone in this process.
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import numpy as np
import pytest
import torch

from pipelined_vec_env import observation_ring, shared_memory
from pipelined_vec_env.debug_envs import CameraEnv

from .test_frame_copies import KEYS, SIDE, assert_equal, stepped_alone

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FailingCameraEnv(CameraEnv):
    """`CameraEnv` whose step number ``fail_at`` raises ValueError."""

    def __init__(self, fail_at: int) -> None:
        super().__init__(side=SIDE, state_size=4)
        self.fail_at = fail_at

    def step(self, action):
        if self.t + 1 == self.fail_at:
            raise ValueError(f"told to fail at step {self.fail_at}")
        return super().step(action)


def camera(**kwargs):
    return lambda: CameraEnv(side=SIDE, state_size=4, **kwargs)


def address(batch: dict) -> int:
    return batch["camera0_image"].__array_interface__["data"][0]


def test_a_dropped_batchs_memory_is_written_again_and_a_held_ones_never(make_pipelined):
    envs = make_pipelined([camera() for _ in range(4)], envs_per_worker=2)
    actions = np.zeros((4, 7), np.float32)
    envs.reset(seed=0)
    places = []
    for t in range(1, 7):  # the caller drops each batch at the next step
        obs = envs.step(actions)[0]
        assert_equal(obs, stepped_alone(4, t))
        assert not obs["camera0_image"].flags.owndata  # a view, not the caller's copy
        places.append(address(obs))
    assert len(set(places)) == 2  # two generations, taking turns
    assert places[0::2] == [places[0]] * 3

    held = {}
    for t in range(7, 16):
        obs = envs.step(actions)[0]
        assert_equal(obs, stepped_alone(4, t))
        if t == 7:
            held["list"] = [obs]  # a rollout's list
        elif t == 8:
            held["camera"] = obs["camera1_image"]  # one array of the dict
        elif t == 9:
            held["slice"] = obs["state"][1:3]  # a view of a view
        elif t == 10:
            held["tensor"] = torch.from_numpy(obs["camera0_image"])  # holds its array
    assert_equal(held["list"][0], stepped_alone(4, 7))
    np.testing.assert_array_equal(held["camera"], stepped_alone(4, 8)["camera1_image"])
    np.testing.assert_array_equal(held["slice"], stepped_alone(4, 9)["state"][1:3])
    np.testing.assert_array_equal(held["tensor"].numpy(), stepped_alone(4, 10)["camera0_image"])
    held.clear()  # let them go: the generations serve again
    for t in range(16, 19):
        obs = envs.step(actions)[0]
        assert_equal(obs, stepped_alone(4, t))
    assert not obs["camera0_image"].flags.owndata
    assert address(obs) in places


def test_stages_each_take_generations_of_their_own_rows(make_pipelined):
    envs = make_pipelined([camera() for _ in range(6)], envs_per_worker=1, num_stages=2)
    envs.reset(seed=0)
    kept = {0: [], 1: []}
    t = 0
    for _ in range(4):
        t += 1
        for s in (0, 1):
            envs.step_async(np.zeros((3, 7), np.float32), stage=s)
        for s in (1, 0):
            obs = envs.step_wait(stage=s)[0]
            expected = stepped_alone(6, t)
            assert_equal(obs, {k: v[3 * s : 3 * s + 3] for k, v in expected.items()})
            kept[s].append((t, obs))
        t += 1
        whole = envs.step(np.zeros((6, 7), np.float32))[0]  # over both stages' rows
        assert_equal(whole, stepped_alone(6, t))
    for s in (0, 1):
        for t, obs in kept[s]:
            expected = stepped_alone(6, t)
            assert_equal(obs, {k: v[3 * s : 3 * s + 3] for k, v in expected.items()})


def test_shared_observations_read_later_show_the_latest_and_steps_write_them(make_pipelined):
    envs = make_pipelined([camera() for _ in range(4)], envs_per_worker=2)
    actions = np.zeros((4, 7), np.float32)
    envs.reset(seed=0)
    for _ in range(3):
        obs = envs.step(actions)[0]
    del obs
    shared = envs.shared_observations  # the ring ends here
    assert_equal(shared, stepped_alone(4, 3))
    obs = envs.step(actions)[0]
    assert_equal(obs, stepped_alone(4, 4))
    assert_equal(shared, stepped_alone(4, 4))
    assert obs["camera0_image"].flags.owndata  # copies again
    assert envs.get_attr("t") == (4, 4, 4, 4)


def test_a_failed_steps_partial_results_keep_each_envs_last_observation(make_pipelined):
    envs = make_pipelined(
        [camera() for _ in range(3)] + [lambda: FailingCameraEnv(fail_at=4)],
        envs_per_worker=2,
    )
    actions = np.zeros((4, 7), np.float32)
    envs.reset(seed=0)
    for _ in range(3):
        obs = envs.step(actions)[0]
    del obs
    with pytest.raises(ValueError, match="fail at step 4") as caught:
        envs.step(actions)
    obs, mask = caught.value.partial_results[0], caught.value.partial_mask
    assert mask.tolist() == [True, True, False, False]  # env 2 shares env 3's worker
    now, before = stepped_alone(4, 4), stepped_alone(4, 3)
    for g, at in enumerate((now, now, before, before)):
        for key in KEYS:
            np.testing.assert_array_equal(obs[key][g], at[key][g])


def test_without_room_in_dev_shm_for_the_ring_steps_copy(make_pipelined, monkeypatch):
    batch_bytes = 4 * CameraEnv(side=SIDE, state_size=4).observation_space["state"].shape[0]
    frames = 4 * (2 * SIDE * SIDE * 3)
    room = frames + 4 * 8 * batch_bytes + 2**16  # the first buffers fit, a generation not
    for module in (shared_memory, observation_ring):
        monkeypatch.setattr(module, "shm_free_bytes", lambda: room)
    envs = make_pipelined([camera() for _ in range(4)], envs_per_worker=2)
    envs.reset(seed=0)
    for t in range(1, 4):
        obs = envs.step(np.zeros((4, 7), np.float32))[0]
        assert_equal(obs, stepped_alone(4, t))
        assert obs["camera0_image"].flags.owndata


def test_the_generations_are_unlinked_at_close_and_a_held_batch_stays_readable(make_pipelined):
    envs = make_pipelined([camera() for _ in range(4)], envs_per_worker=2)
    names = envs.shared_memory_names
    assert len(names) == 3 * len(KEYS)  # the first buffers and two generations, per key
    envs.reset(seed=0)
    obs = envs.step(np.zeros((4, 7), np.float32))[0]
    assert not obs["camera0_image"].flags.owndata
    envs.close()
    assert [name for name in names if os.path.exists(f"/dev/shm/{name}")] == []
    assert_equal(obs, stepped_alone(4, 1))  # its mapping lives as long as the arrays
