"""Rollout videos: per-stage recording, file names with the task, frames read back."""

from __future__ import annotations

import numpy as np
import pytest

from pipelined_vec_env.video import StageVideoRecorder, burn_in_text, slugify, write_video

imageio = pytest.importorskip("imageio.v2")
pytest.importorskip("imageio_ffmpeg")


def test_stage_recorder_writes_one_video_per_chosen_env(tmp_path) -> None:
    slices = [slice(0, 2), slice(2, 4)]
    rec = StageVideoRecorder(tmp_path, env_ids=[0, 3], stage_slices=slices, burn_in=False)
    texts = ["put the bowl on the plate", "open the top drawer"]
    for t in range(5):
        for stage, sl in enumerate(slices):
            # frame value encodes (env, t) so we can check what was recorded
            images = np.stack(
                [np.full((32, 48, 3), 40 * g + 5 * t, np.uint8) for g in range(sl.start, sl.stop)]
            )
            rec.add({"agentview_image": images}, stage=stage, texts=texts)
    paths = rec.finish(prefix="it7_")
    assert [p.name for p in paths] == [
        "it7_stage0_env000_put_the_bowl_on_the_plate.mp4",
        "it7_stage1_env003_open_the_top_drawer.mp4",
    ]
    frames = imageio.mimread(paths[1])
    assert len(frames) == 5 and frames[0].shape == (32, 48, 3)
    # lossy codec: means within a few levels of what env 3 showed at t = 0 and t = 4
    assert abs(frames[0].mean() - 120) < 4 and abs(frames[4].mean() - 140) < 4
    assert rec.finish() == []  # buffers cleared


def test_burned_in_text_adds_a_band_and_pads_to_block(tmp_path) -> None:
    frame = np.full((30, 50, 3), 200, np.uint8)
    banded = burn_in_text(frame, "pick up the alphabet soup and place it in the basket")
    assert banded.shape[0] > 30 and banded.shape[1] == 50
    np.testing.assert_array_equal(banded[:30], frame)
    assert banded[30:].max() > 200  # light text drawn on the dark band
    path = write_video(tmp_path / "v.mp4", [frame] * 3, text="hello")
    read = imageio.mimread(path)
    assert read[0].shape[0] % 16 == 0 and read[0].shape[1] % 16 == 0
    assert slugify("Put the Bowl -> plate!") == "put_the_bowl_plate"
