"""Camera observations of LiberoEnv (one env with both cameras, ~2 GB, software EGL)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("libero")

from pipelined_vec_env.libero.env import LiberoEnv  # noqa: E402


def test_camera_images_are_upright_uint8_of_the_asked_size() -> None:
    # libero_10 task 2 has 2 objects (67-dim state); the suite pads to 151
    env = LiberoEnv(
        "libero_10",
        2,
        cameras=("agentview", "wrist"),
        image_size=(48, 64),
        render_mode="rgb_array",
    )
    try:
        assert set(env.observation_space.spaces) == {"state", "agentview_image", "wrist_image"}
        obs, info = env.reset(seed=0)
        assert env.observation_space.contains(obs)
        assert info["state_size"] == 67 and obs["state"].shape == (151,)
        assert np.all(obs["state"][67:] == 0) and np.count_nonzero(obs["state"][:67]) > 40
        for key in ("agentview_image", "wrist_image"):
            assert obs[key].shape == (48, 64, 3) and obs[key].dtype == np.uint8
            assert obs[key].std() > 5  # a rendered scene, not a blank frame
        obs, *_ = env.step(np.zeros(7, dtype=np.float32))
        # robosuite's frame is bottom-up (OpenGL); ours is its vertical flip. Two renders
        # of one state may differ in a few pixels by a level or two (software GL), so
        # compare by mean absolute difference.
        raw = env._sim_env.env._get_observations(force_update=True)["agentview_image"]

        def diff(a: np.ndarray, b: np.ndarray) -> float:
            return float(np.abs(a.astype(np.int16) - b).mean())

        assert diff(obs["agentview_image"], raw[::-1]) < 0.5 < 5 < diff(obs["agentview_image"], raw)
        assert diff(env.render(), obs["agentview_image"]) < 0.5
        env.image_flip = "rotate180"
        assert diff(env.render(), raw[::-1, ::-1]) < 0.5
    finally:
        env.close()
