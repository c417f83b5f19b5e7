"""Observation buffers bigger than the free space of /dev/shm: file-backed mappings with one
warning (or `SharedMemoryFullError`), never a SIGBUS; their files go at close and after a
crash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelined_vec_env import (
    PipelinedVectorEnv,
    SharedMemoryFallbackWarning,
    SharedMemoryFullError,
    shared_memory,
)

REPO = Path(__file__).resolve().parents[1]

# 8 envs of a (1024, 1024, 3) uint8 frame: 24 MiB of buffers; frame value (10 * seed + 7 * t)
FRAMES_ENV = textwrap.dedent(
    """
    import json, os, sys, warnings
    import gymnasium as gym
    import numpy as np
    from pipelined_vec_env import PipelinedVectorEnv

    class Frames(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (1024, 1024, 3), np.uint8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t, self.base = 0, seed or 0
            return self._obs(), {}

        def _obs(self):
            return np.full((1024, 1024, 3), (10 * self.base + 7 * self.t) % 256, np.uint8)

        def step(self, action):
            self.t += 1
            return self._obs(), 0.0, False, False, {}

    if __name__ == "__main__":
        if len(sys.argv) > 2:  # fill /dev/shm but for this many bytes
            stat = os.statvfs("/dev/shm")
            fd = os.open("/dev/shm/filler", os.O_CREAT | os.O_RDWR)
            os.posix_fallocate(fd, 0, stat.f_bavail * stat.f_frsize - int(sys.argv[2]))
            os.close(fd)
        report = {"shm": os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                envs = PipelinedVectorEnv([Frames] * 8, envs_per_worker=4, shm_fallback=sys.argv[1])
            except OSError as exc:
                report["error"] = f"{type(exc).__name__}: {exc}"
                print(json.dumps(report))
                sys.exit(0)
        report["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
        envs.reset(seed=list(range(8)))
        obs = None
        for _ in range(3):
            obs, *_ = envs.step(np.zeros(8, np.int64))
        expected = [(10 * i + 21) % 256 for i in range(8)]
        report["ok"] = all(obs[i].min() == obs[i].max() == expected[i] for i in range(8))
        report["files"] = envs.shared_memory_names
        envs.close()
        report["left"] = [f for f in report["files"] if os.path.exists(f)]
        print(json.dumps(report))
    """
)


def _in_small_shm(tmp_path: Path, fallback: str, free: int | None = None) -> dict[str, Any]:
    """Run `FRAMES_ENV` as root in a mount namespace whose /dev/shm is a 16 MiB tmpfs (with
    ``free``, filled but for that many bytes first)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a small /dev/shm")
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=16m tmpfs /dev/shm"],
        capture_output=True,
        timeout=30,
    )
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace can be made here: {probe.stderr.decode().strip()}")
    script = tmp_path / "frames_in_small_shm.py"
    script.write_text(FRAMES_ENV)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    run = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "{sys.executable}" '
            f'"{script}" {fallback} {"" if free is None else free}',
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, f"exit {run.returncode} (-7/135: SIGBUS)\n{run.stderr[-3000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_frames_bigger_than_a_small_dev_shm_step_correctly_with_one_warning(
    tmp_path: Path,
) -> None:
    report = _in_small_shm(tmp_path, "file")
    assert report["shm"] == 16 * 2**20
    assert report["ok"], report
    assert len(report["warnings"]) == 1, report["warnings"]
    warning = report["warnings"][0]
    assert warning.startswith("SharedMemoryFallbackWarning")
    assert "25165824 bytes" in warning and "--shm-size" in warning and "medium: Memory" in warning
    assert all(not f.startswith("/dev/shm") for f in report["files"])
    assert report["left"] == []


def test_a_full_dev_shm_kills_nothing_the_steps_go_pickled_and_the_buffers_to_files(
    tmp_path: Path,
) -> None:
    """/dev/shm full but for 4 KiB: the buffers go to files (one warning), the workers'
    step slots find no room (each step then goes pickled), and nothing dies of SIGBUS."""
    report = _in_small_shm(tmp_path, "file", free=4096)
    assert report["ok"], report
    assert [w.split(":")[0] for w in report["warnings"]] == ["SharedMemoryFallbackWarning"]
    assert all(not f.startswith("/dev/shm") for f in report["files"])
    assert report["left"] == []


def test_shm_fallback_error_raises_from_the_constructor(tmp_path: Path) -> None:
    report = _in_small_shm(tmp_path, "error")
    assert report["error"].startswith("SharedMemoryFullError: the observation buffers need")
    assert "--shm-size" in report["error"]


def _small_shm(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(shared_memory, "shm_free_bytes", lambda: free)


def test_file_backed_buffers_step_and_are_removed_at_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipelined_vec_env.debug_envs import CountingEnv

    _small_shm(monkeypatch, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = PipelinedVectorEnv([CountingEnv] * 4, envs_per_worker=2)
    try:
        assert [w.category for w in caught] == [SharedMemoryFallbackWarning]
        files = envs.shared_memory_names
        assert files and all(os.path.isfile(f) for f in files)
        first, _ = envs.reset(seed=[0, 1, 2, 3])
        obs, *_ = envs.step(envs.action_space.sample())
        sync = _sync_reference(4)
        np.testing.assert_array_equal(first, sync[0])
        assert not np.array_equal(obs, first)
    finally:
        envs.close()
    assert not any(os.path.exists(f) for f in files)
    assert not os.path.exists(os.path.dirname(files[0]))


def _sync_reference(n: int) -> tuple[Any, ...]:
    import gymnasium as gym

    from pipelined_vec_env.debug_envs import CountingEnv

    sync = gym.vector.SyncVectorEnv([CountingEnv] * n)
    try:
        return sync.reset(seed=list(range(n)))
    finally:
        sync.close()


def test_shm_fallback_error_is_raised_and_no_worker_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import psutil

    from pipelined_vec_env.debug_envs import CountingEnv

    _small_shm(monkeypatch, 1)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(SharedMemoryFullError, match=r"need \d+ bytes .* has 1 bytes") as info:
        PipelinedVectorEnv([CountingEnv] * 2, shm_fallback="error")
    assert info.value.free == 1 and info.value.needed > 1
    left = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert all("forkserver" in " ".join(p.cmdline()) for p in left), left


def test_shm_fallback_is_checked_before_any_worker_starts() -> None:
    def never() -> Any:
        raise AssertionError("no env may be built")

    with pytest.raises(ValueError, match="shm_fallback: expected 'file' or 'error', got 'disk'"):
        PipelinedVectorEnv([never], shm_fallback="disk")


def test_a_dead_callers_buffer_directory_is_removed_by_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    stale = Path(tempfile.gettempdir()) / f"pipelined-vec-env-buffers-{int(dead.stdout)}-test"
    stale.mkdir()
    (stale / "0.buf").write_bytes(b"x")
    _small_shm(monkeypatch, 0)
    with pytest.warns(SharedMemoryFallbackWarning):
        created = shared_memory.create_observation_buffers(
            __import__("gymnasium").spaces.Box(0, 1, (4,)), 2
        )
    assert created is not None
    shared_memory.release(created[1])
    assert not stale.exists()
