"""Rollout videos per stage: camera frames of chosen envs written as mp4.

The reference VLA trainers save, at the end of each rollout, a video of a few envs per
pipeline stage with the task text; this module does the same for any vector env whose
observations hold images (for LIBERO: ``cameras=("agentview",)``).

Needs ``imageio`` with its ffmpeg plugin (``imageio-ffmpeg``; in the ``libero`` and
``train`` extras) and Pillow (an ``imageio`` dependency) for the text overlay.
"""

from __future__ import annotations

import logging
import pathlib
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["StageVideoRecorder", "burn_in_text", "slugify", "write_video"]

logger = logging.getLogger(__name__)


def slugify(text: str, max_length: int = 80) -> str:
    """Make text safe for a file name: lowercase, runs of other characters become ``_``.

    Args:
        text: Any text, e.g. a task instruction.
        max_length: Longest result.

    Returns:
        ``[a-z0-9_]`` text, at most ``max_length`` characters ("untitled" if empty).
    """
    slug = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:max_length].rstrip("_")
    return slug or "untitled"


def burn_in_text(frame: np.ndarray, text: str) -> np.ndarray:
    """Return a copy of ``frame`` with ``text`` on a dark band added below it.

    Args:
        frame: uint8 ``(H, W, 3)`` RGB image.
        text: Text to draw, wrapped to the frame width.

    Returns:
        uint8 ``(H + band, W, 3)``; the band height depends on the number of lines and
        is the same for the same text and width.

    Raises:
        ValueError: If ``frame`` is not ``(H, W, 3)``.
    """
    from PIL import Image, ImageDraw, ImageFont

    frame = np.asarray(frame, dtype=np.uint8)
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"Expected an (H, W, 3) RGB frame, got shape {frame.shape}.")
    height, width, _ = frame.shape
    font = ImageFont.load_default()
    char_width = max(font.getbbox("M")[2], 1)
    line_height = font.getbbox("Mg")[3] + 2
    lines = textwrap.wrap(text, width=max(width // char_width, 1)) or [""]
    band = line_height * len(lines) + 4
    canvas = Image.new("RGB", (width, height + band), (0, 0, 0))
    canvas.paste(Image.fromarray(frame), (0, 0))
    draw = ImageDraw.Draw(canvas)
    for i, line in enumerate(lines):
        draw.text((2, height + 2 + i * line_height), line, fill=(255, 255, 255), font=font)
    return np.asarray(canvas)


def _pad_to_block(frame: np.ndarray, block: int = 16) -> np.ndarray:
    height, width = frame.shape[:2]
    pad_h, pad_w = -height % block, -width % block
    if pad_h or pad_w:
        frame = np.pad(frame, ((0, pad_h), (0, pad_w), (0, 0)))
    return frame


def write_video(
    path: str | pathlib.Path,
    frames: Sequence[np.ndarray] | np.ndarray,
    fps: int = 20,
    text: str | None = None,
) -> pathlib.Path:
    """Write frames to an mp4 (H.264 via imageio's ffmpeg plugin).

    Args:
        path: Output file; parent folders are created.
        frames: ``T`` uint8 ``(H, W, 3)`` RGB frames (a list or a ``(T, H, W, 3)`` array).
            Frames are padded with black at the bottom and right to multiples of 16
            pixels, which H.264 players expect; they are never rescaled.
        fps: Frames per second (LIBERO's control rate is 20 Hz).
        text: Burned in below each frame when given (see `burn_in_text`).

    Returns:
        The written path.

    Raises:
        ValueError: If there are no frames.
    """
    import imageio.v2 as imageio

    if len(frames) == 0:
        raise ValueError("write_video needs at least one frame.")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with imageio.get_writer(path, fps=fps, codec="libx264", macro_block_size=1) as writer:
        for frame in frames:
            frame = np.asarray(frame, dtype=np.uint8)
            if text is not None:
                frame = burn_in_text(frame, text)
            writer.append_data(_pad_to_block(frame))
    logger.info("wrote %d frames to %s", len(frames), path)
    return path


class StageVideoRecorder:
    """Collect frames of chosen envs during a staged rollout; one mp4 per env on finish.

    Feed it each batch a stage returns (``add(obs, stage=s)`` after ``step_wait(stage=s)``
    or ``reset_wait``), and the task text when it is known (``texts=`` from
    ``info["language_instruction"]`` at reset). ``finish()`` writes
    ``{directory}/{prefix}stage{s}_env{i:03d}_{task_slug}.mp4`` for every recorded env
    with frames, with the text also burned in, then clears the buffers.

    Args:
        directory: Output folder.
        env_ids: Global indices of the envs to record (e.g. the first env of each stage).
        stage_slices: Each stage's env slice, as the vector env's ``stage_slices``; needed
            for ``add(..., stage=s)``.
        image_key: Observation key holding the frames (Dict observations), or None when
            observations are image arrays themselves.
        fps: Video frame rate.
        burn_in: Draw the task text under the frames.

    Examples:
        >>> import numpy as np, tempfile
        >>> rec = StageVideoRecorder(tempfile.mkdtemp(), env_ids=[1], stage_slices=[slice(0, 2)],
        ...                          image_key=None)
        >>> for t in range(3):
        ...     rec.add(np.zeros((2, 32, 32, 3), np.uint8), stage=0, texts=["open the drawer"] * 2)
        >>> [p.name for p in rec.finish(prefix="it0_")]
        ['it0_stage0_env001_open_the_drawer.mp4']
    """

    def __init__(
        self,
        directory: str | pathlib.Path,
        env_ids: Sequence[int],
        stage_slices: Sequence[slice] | None = None,
        image_key: str | None = "agentview_image",
        fps: int = 20,
        burn_in: bool = True,
    ) -> None:
        self.directory = pathlib.Path(directory)
        self.env_ids = [int(i) for i in env_ids]
        self.stage_slices = list(stage_slices) if stage_slices is not None else None
        self.image_key = image_key
        self.fps = int(fps)
        self.burn_in = bool(burn_in)
        self._frames: dict[int, list[np.ndarray]] = {i: [] for i in self.env_ids}
        self._texts: dict[int, str] = {}

    def _stage_of(self, env_id: int) -> int | None:
        for s, sl in enumerate(self.stage_slices or []):
            if sl.start <= env_id < sl.stop:
                return s
        return None

    def add(
        self,
        observations: Mapping[str, Any] | np.ndarray,
        *,
        stage: int | None = None,
        batch_env_ids: Sequence[int] | None = None,
        texts: Sequence[str] | None = None,
    ) -> None:
        """Append the frames of recorded envs from one batch.

        Args:
            observations: Batched observations (Dict with ``image_key``, or an image
                array) of shape ``(B, H, W, 3)`` for the envs of the batch.
            stage: The batch is stage ``s`` of the vector env (envs
                ``stage_slices[s]``).
            batch_env_ids: Or: the global env index of each batch row.
            texts: Optional task text per batch row; remembered per env.

        Raises:
            ValueError: If neither or both of ``stage`` and ``batch_env_ids`` are given,
                or ``stage`` is given without ``stage_slices``.
        """
        if (stage is None) == (batch_env_ids is None):
            raise ValueError("Give exactly one of stage= or batch_env_ids=.")
        if stage is not None:
            if self.stage_slices is None:
                raise ValueError("add(stage=...) needs stage_slices at construction.")
            sl = self.stage_slices[stage]
            batch_env_ids = range(sl.start, sl.stop)
        images = observations[self.image_key] if self.image_key is not None else observations
        for row, env_id in enumerate(batch_env_ids):
            if env_id in self._frames:
                self._frames[env_id].append(np.array(images[row], dtype=np.uint8))
                if texts is not None and texts[row] is not None:
                    self._texts[env_id] = str(texts[row])

    def finish(self, prefix: str = "") -> list[pathlib.Path]:
        """Write one video per recorded env that has frames, then clear the buffers.

        Args:
            prefix: Prepended to every file name (e.g. ``"iter0012_"``).

        Returns:
            Paths written, in ``env_ids`` order.
        """
        paths = []
        for env_id in self.env_ids:
            frames = self._frames[env_id]
            if not frames:
                continue
            text = self._texts.get(env_id, "")
            stage = self._stage_of(env_id)
            stage_part = f"stage{stage}_" if stage is not None else ""
            name = f"{prefix}{stage_part}env{env_id:03d}_{slugify(text)}.mp4"
            paths.append(
                write_video(
                    self.directory / name,
                    frames,
                    fps=self.fps,
                    text=text if self.burn_in and text else None,
                )
            )
        self._frames = {i: [] for i in self.env_ids}
        return paths
