"""Resources: creating and closing 200 vector envs leaks no process, fd or shared memory.

The loop runs in a fresh interpreter, so that nothing else in the test session opens
or closes file descriptors or processes while it is measured. That interpreter counts,
after a short warm-up and again after 200 create/step/close cycles (forkserver, one or
two workers each, half of them closed with a step still in flight):

- child processes (psutil, recursive; the forkserver and the resource tracker are part of
  the warm-up baseline),
- open file descriptors (``/proc/self/fd``),
- mappings of ``/dev/shm/`` segments (``/proc/self/maps``),
- live threads,

and lists every shared memory segment it created (``envs.shared_memory_names``) that
still exists in ``/dev/shm``.
The forkserver preloads the worker module, as a long-running user would, so that a worker
starts in milliseconds rather than re-importing gymnasium each time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.debug_envs import CountingEnv

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

CYCLES = 200

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading
    import multiprocessing as mp
    from functools import partial

    import numpy as np
    import psutil

    from pipelined_vec_env import PipelinedVectorEnv
    from pipelined_vec_env.debug_envs import CountingEnv


    def snapshot():
        with open("/proc/self/maps") as maps:
            shm_maps = sum("/dev/shm/" in line for line in maps)
        return {
            "children": sorted(p.pid for p in psutil.Process().children(recursive=True)),
            "fds": len(os.listdir("/proc/self/fd")),
            "shm_maps": shm_maps,
            "threads": threading.active_count(),
        }


    def cycle(i, segments):
        n = 1 + i % 2  # one or two workers, one env each, one stage per worker
        kind = "dict" if i % 3 == 0 else "box"  # dict: several segments per env
        envs = PipelinedVectorEnv(
            [partial(CountingEnv, k, 3, kind) for k in range(n)], num_stages=n, context="forkserver"
        )
        try:
            segments.extend(envs.shared_memory_names)
            envs.reset(seed=i)
            envs.step(np.zeros(n, dtype=np.int64))
            if i % 2:
                envs.step_async(np.zeros(1, dtype=np.int64), stage=0)  # closed in flight
        finally:
            envs.close(terminate=bool(i % 4 == 1))


    if __name__ == "__main__":
        mp.set_forkserver_preload(["pipelined_vec_env.workers.worker", "pipelined_vec_env.debug_envs"])
        cycles = int(sys.argv[1])
        segments = []
        for i in range(4):  # warm-up: forkserver, resource tracker, imports, caches
            cycle(i, segments)
        before = snapshot()
        for i in range(cycles):
            cycle(i, segments)
        after = snapshot()
        left = [s for s in segments if os.path.exists("/dev/shm/" + s)]
        print(json.dumps({"before": before, "after": after, "segments": len(segments), "left": left}))
    """
)


def test_create_and_close_many_envs_leaks_nothing(tmp_path: Path) -> None:
    script = tmp_path / "cycles.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(CYCLES)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    before, after = report["before"], report["after"]
    assert after["children"] == before["children"]  # only the forkserver and resource tracker
    assert after["fds"] == before["fds"]
    assert after["shm_maps"] == before["shm_maps"] == 0
    assert after["threads"] == before["threads"]
    assert report["segments"] >= CYCLES and report["left"] == []
    assert "Traceback" not in done.stderr and "leaked" not in done.stderr, done.stderr


def test_shared_memory_names_exist_while_open_and_are_gone_after_close() -> None:
    envs = PipelinedVectorEnv([partial(CountingEnv, k, 3, "dict") for k in range(2)])
    try:
        names = envs.shared_memory_names
        assert names and all(isinstance(name, str) for name in names)
        assert all(Path("/dev/shm", name.lstrip("/")).exists() for name in names)
    finally:
        envs.close()
    assert envs.shared_memory_names == []
    assert not any(Path("/dev/shm", name.lstrip("/")).exists() for name in names)
