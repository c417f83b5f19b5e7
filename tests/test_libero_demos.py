"""Demonstration files: our writer and loader, and a file in LIBERO's own layout (no simulator)."""

from __future__ import annotations

import json

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from pipelined_vec_env.libero.demos import Demo, DemoSet, load_demos, write_demos  # noqa: E402


def _demo(rng: np.random.Generator, length: int, k: int) -> Demo:
    return Demo(
        obs={
            "goal_features": rng.normal(size=(length, 23)).astype(np.float32),
            "state": rng.normal(size=(length, 137)).astype(np.float32),
        },
        actions=rng.uniform(-1, 1, size=(length, 7)).astype(np.float32),
        rewards=np.r_[np.zeros(length - 1), 1.0].astype(np.float32),
        dones=np.r_[np.zeros(length - 1), 1].astype(np.uint8),
        extras={"executed_actions": rng.uniform(-1, 1, size=(length, 7)).astype(np.float32)},
        attrs={"init_state_id": k, "success": True},
    )


def test_round_trip_keeps_arrays_attrs_and_demo_order(tmp_path):
    rng = np.random.default_rng(0)
    # 12 demos: demo_10 and demo_11 must come back after demo_9 (not after demo_1)
    demos = DemoSet(
        demos=[_demo(rng, 5 + k, k) for k in range(12)],
        attrs={
            "env_name": "pipelined_vec_env/libero_object-v0",
            "env_args": {"env_name": "x", "env_kwargs": {"suite": "libero_object", "task_id": 0}},
            "problem_info": {"language_instruction": "pick up the soup"},
        },
    )
    path = tmp_path / "demos.hdf5"
    write_demos(path, demos)
    loaded = load_demos(path)
    assert loaded.names == [f"demo_{k}" for k in range(12)]
    assert loaded.attrs["num_demos"] == 12 and loaded.attrs["total"] == demos.num_samples
    assert loaded.attrs["env_args"]["env_kwargs"] == {"suite": "libero_object", "task_id": 0}
    assert loaded.attrs["problem_info"]["language_instruction"] == "pick up the soup"
    for original, back in zip(demos.demos, loaded.demos, strict=True):
        assert back.obs.keys() == original.obs.keys()
        for key in original.obs:
            np.testing.assert_array_equal(back.obs[key], original.obs[key])
        np.testing.assert_array_equal(back.actions, original.actions)
        np.testing.assert_array_equal(back.rewards, original.rewards)
        np.testing.assert_array_equal(back.dones, original.dones)
        np.testing.assert_array_equal(
            back.extras["executed_actions"], original.extras["executed_actions"]
        )
        assert back.attrs["init_state_id"] == original.attrs["init_state_id"]
        assert back.attrs["num_samples"] == len(original)
    # the layout on disk is robomimic's
    with h5py.File(path, "r") as f:
        assert f["data/demo_3/obs/goal_features"].shape == (8, 23)
        assert f["data/demo_3/actions"].shape == (8, 7)
        assert json.loads(f["data"].attrs["env_args"])["env_name"] == "x"
    only = load_demos(path, obs_keys=["goal_features"], max_demos=2)
    assert len(only) == 2 and only.obs_keys == ["goal_features"]


def _write_libero_style_file(path) -> None:
    """A file shaped like LIBERO's released ``*_demo.hdf5`` (create_dataset.py's layout)."""
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["env_name"] = "OffScreenRenderEnv"
        data.attrs["problem_info"] = json.dumps(
            {"problem_name": "libero_object_task", "language_instruction": "pick up the milk"}
        )
        data.attrs["env_args"] = json.dumps({"type": 1, "env_name": "x", "env_kwargs": {}})
        data.attrs["bddl_file_name"] = "pick_up_the_milk.bddl"
        data.attrs["macros_image_convention"] = "opengl"
        for k, length in enumerate((6, 4)):
            demo = data.create_group(f"demo_{k}")
            demo.attrs["num_samples"] = length
            demo.attrs["init_state"] = rng.normal(size=71)
            demo.create_dataset(
                "obs/agentview_rgb", data=rng.integers(0, 255, (length, 8, 8, 3), dtype=np.uint8)
            )
            demo.create_dataset("obs/ee_pos", data=rng.normal(size=(length, 3)))
            demo.create_dataset("obs/gripper_states", data=rng.normal(size=(length, 2)))
            demo.create_dataset("obs/joint_states", data=rng.normal(size=(length, 7)))
            demo.create_dataset("actions", data=rng.uniform(-1, 1, (length, 7)))
            demo.create_dataset("rewards", data=np.r_[np.zeros(length - 1), 1])
            demo.create_dataset("dones", data=np.r_[np.zeros(length - 1), 1])
            demo.create_dataset("states", data=rng.normal(size=(length, 71)))
            demo.create_dataset("robot_states", data=rng.normal(size=(length, 9)))
        mask = f.create_group("mask")
        mask.create_dataset("valid", data=np.array([b"demo_1"]))


def test_a_libero_layout_file_loads(tmp_path):
    path = tmp_path / "pick_up_the_milk_demo.hdf5"
    _write_libero_style_file(path)
    demos = load_demos(path)
    assert len(demos) == 2 and [len(d) for d in demos.demos] == [6, 4]
    first = demos.demos[0]
    assert set(first.obs) == {"agentview_rgb", "ee_pos", "gripper_states", "joint_states"}
    image = first.obs["agentview_rgb"]
    assert image.dtype == np.uint8 and image.shape == (6, 8, 8, 3)
    assert first.actions.dtype == np.float32 and first.actions.shape == (6, 7)
    assert first.dones.dtype == np.uint8 and first.dones[-1] == 1
    assert set(first.extras) == {"states", "robot_states"}
    assert first.attrs["init_state"].shape == (71,)
    assert demos.attrs["problem_info"]["language_instruction"] == "pick up the milk"
    valid = load_demos(path, filter_key="valid", obs_keys=["ee_pos"])
    assert valid.names == ["demo_1"] and len(valid.demos[0]) == 4


def test_bad_files_and_keys_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no demonstration file"):
        load_demos(tmp_path / "missing.hdf5")
    path = tmp_path / "libero.hdf5"
    _write_libero_style_file(path)
    with pytest.raises(ValueError, match=r"has no \['goal_features'\]"):
        load_demos(path, obs_keys=["goal_features"])
    with pytest.raises(ValueError, match="no mask/train"):
        load_demos(path, filter_key="train")
    empty = tmp_path / "empty.hdf5"
    with h5py.File(empty, "w") as f:
        f.create_group("something")
    with pytest.raises(ValueError, match="no 'data' group"):
        load_demos(empty)
    rng = np.random.default_rng(2)
    bad = _demo(rng, 5, 0)
    bad.rewards = bad.rewards[:3]
    with pytest.raises(ValueError, match="demo_0/rewards has 3 steps"):
        write_demos(tmp_path / "bad.hdf5", DemoSet(demos=[bad]))
