"""Camera frames do not depend on how envs share processes: several envs in one worker (any
``envs_per_worker``, the default layout) or in one process render what each renders alone,
pixel for pixel, for LIBERO (robosuite) and gymnasium's MuJoCo envs."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from .conftest import needs_libero

FRAME_DIR = Path(os.environ.get("PIPELINED_FRAMES_DIR", "/tmp/pipelined_frames"))


def _save(name: str, frame: np.ndarray) -> None:
    """Keep a frame as a PNG for looking at (imageio; skipped when it is missing)."""
    try:
        import imageio.v3 as iio
    except ImportError:
        return
    FRAME_DIR.mkdir(parents=True, exist_ok=True)
    iio.imwrite(FRAME_DIR / f"{name}.png", frame)


def _rollout(envs: Any, actions: np.ndarray) -> list[Any]:
    """Observations of a reset (seeds 0..n-1) and one step per row of ``actions``."""
    obs, _ = envs.reset(seed=list(range(envs.num_envs)))
    frames = [obs]
    for action in actions:
        obs, *_ = envs.step(action)
        frames.append(obs)
    return frames


def _assert_same_frames(reference: list[Any], other: list[Any], label: str) -> None:
    for t, (a, b) in enumerate(zip(reference, other, strict=True)):
        for key in a if isinstance(a, dict) else [None]:
            x, y = (a, b) if key is None else (a[key], b[key])
            for env, (fx, fy) in enumerate(zip(x, y, strict=True)):
                diff = int(np.abs(fx.astype(np.int16) - fy).max())
                assert diff == 0, f"{label}: step {t}, env {env}, {key}: max pixel diff {diff}"


# ------------------------------------------------------------------------------ LIBERO


def _libero(task_id: int) -> gym.Env:
    from pipelined_vec_env.libero.env import LiberoEnv

    return LiberoEnv("libero_object", task_id, cameras=("agentview", "wrist"), image_size=128)


@needs_libero
def test_libero_frames_are_the_same_in_any_layout(make_pipelined: Any) -> None:
    """Three libero_object tasks: one env per worker, all three in one worker, and the
    default layout give the same 128 px frames for the same seeds and actions."""
    fns = [functools.partial(_libero, task) for task in (0, 1, 2)]
    actions = np.random.default_rng(0).uniform(-1, 1, size=(2, 3, 7)).astype(np.float32)
    runs = {}
    for label, per_worker in (("alone", 1), ("shared", 3), ("default", None)):
        envs = make_pipelined(fns, envs_per_worker=per_worker)
        runs[label] = _rollout(envs, actions)
        envs.close()
    for env in range(3):
        _save(f"libero_object_task{env}_alone", runs["alone"][-1]["agentview_image"][env])
        _save(f"libero_object_task{env}_shared", runs["shared"][-1]["agentview_image"][env])
    scenes = runs["alone"][0]["agentview_image"]
    assert np.abs(scenes[0].astype(np.int16) - scenes[1]).max() > 50  # three different scenes
    _assert_same_frames(runs["alone"], runs["shared"], "envs_per_worker=3")
    _assert_same_frames(runs["alone"], runs["default"], "default layout")


@needs_libero
def test_two_libero_envs_in_one_process_render_what_they_render_alone() -> None:
    """An env's frames (observations and ``render()``) are the same before and after a
    second env is built in its process, and the second's are the same before and after
    the first is closed."""
    from pipelined_vec_env.libero.env import LiberoEnv

    def frames(env: LiberoEnv) -> list[np.ndarray]:
        obs, _ = env.reset(seed=0)
        out = [obs["agentview_image"], env.render()]
        obs, *_ = env.step(np.full(7, 0.5, dtype=np.float32))
        return [*out, obs["agentview_image"], obs["wrist_image"]]

    def make(task: int) -> LiberoEnv:
        return LiberoEnv(
            "libero_object",
            task,
            cameras=("agentview", "wrist"),
            image_size=64,
            render_mode="rgb_array",
        )

    first = make(0)
    second = None
    try:
        alone = frames(first)
        second = make(1)
        second_with_first = frames(second)
        first_with_second = frames(first)
        first.close()
        second_alone = frames(second)
    finally:
        first.close()
        if second is not None:
            second.close()
    _save("libero_object_task0_alone_64", alone[0])
    _save("libero_object_task0_beside_task1_64", first_with_second[0])
    _assert_same_frames([alone], [first_with_second], "first env beside a second")
    _assert_same_frames([second_alone], [second_with_first], "second env beside the first")
    assert np.abs(alone[0].astype(np.int16) - second_alone[0]).max() > 50  # two scenes


# ------------------------------------------------------------------ gymnasium MuJoCo


def _mujoco_frames(env_id: str) -> gym.Env:
    """A gymnasium MuJoCo env whose observation is its 64 px ``rgb_array`` frame and whose
    action is 6 values in [-1, 1] (an env with fewer joints takes the first ones)."""
    # headless; set here, in the worker: a forkserver started earlier keeps its environment
    os.environ.setdefault("MUJOCO_GL", "egl")
    env = gym.make(env_id, render_mode="rgb_array", width=64, height=64)
    n = env.action_space.shape[0]
    six = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    env = gym.wrappers.TransformAction(env, lambda action: action[:n], six)
    return gym.wrappers.AddRenderObservation(env, render_only=True)


def test_mujoco_frames_are_the_same_with_two_models_in_one_worker(make_pipelined: Any) -> None:
    pytest.importorskip("mujoco")
    # Walker2d and Hopper track their torso with a configured camera; HalfCheetah's and
    # InvertedPendulum's first frames differ between two runs of one process (gymnasium
    # 1.x leaves part of their default camera unset), so they cannot be compared.
    fns = [functools.partial(_mujoco_frames, i) for i in ("Walker2d-v5", "Hopper-v5")]
    actions = np.random.default_rng(0).uniform(-1, 1, size=(3, 2, 6)).astype(np.float32)
    alone = _rollout(make_pipelined(fns, envs_per_worker=1), actions)
    shared = _rollout(make_pipelined(fns, envs_per_worker=2), actions)
    _save("walker2d_shared", shared[-1][0])
    _save("hopper_shared", shared[-1][1])
    assert np.abs(alone[0][0].astype(np.int16) - alone[0][1]).max() > 50  # two scenes
    _assert_same_frames(alone, shared, "two MuJoCo models in one worker")


def test_two_mujoco_models_in_one_process_render_what_they_render_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gymnasium 1.x alone draws Walker2d beside a Hopper with the Hopper's floor and sky;
    with `own_gl_contexts` each renders what it renders alone, also after the other
    closed."""
    pytest.importorskip("mujoco")
    monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl"))
    from pipelined_vec_env.gl_contexts import own_gl_contexts

    def make(env_id: str) -> gym.Env:
        return own_gl_contexts(gym.make(env_id, render_mode="rgb_array", width=64, height=64))

    def frame(env: gym.Env, seed: int) -> np.ndarray:
        env.reset(seed=seed)
        return env.render()

    walker = make("Walker2d-v5")
    alone = frame(walker, 0)
    hopper = make("Hopper-v5")
    try:
        hopper_beside = frame(hopper, 1)
        assert np.array_equal(frame(walker, 0), alone)
        walker.close()
        assert np.array_equal(frame(hopper, 1), hopper_beside)
    finally:
        walker.close()
        hopper.close()
