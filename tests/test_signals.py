"""Signals: Ctrl-C gives one clean traceback; a parent killed by a signal leaves nothing.

Each test runs a small script in its own session (so the signal reaches its process group
only), lets it step, signals it, and then checks its stderr, its descendants (workers,
forkserver, resource tracker) and its shared memory segments. The only time bounds are
generous hang bounds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]

#: Seconds the processes of a dead parent may take to go away (a hang bound, not a timing).
GONE_WITHIN = 30.0

PARENT = textwrap.dedent(
    """
    import json, signal, sys
    from functools import partial

    import numpy as np

    from pipelined_vec_env import PipelinedVectorEnv
    from pipelined_vec_env.debug_envs import FaultyEnv

    def main(cleanup, busy, on_sigterm):
        if on_sigterm == "exit":
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
        envs = PipelinedVectorEnv([partial(FaultyEnv, 60.0) for _ in range(4)], num_stages=2)
        envs.reset(seed=0)
        try:
            if busy:  # stage 0's first worker sleeps in env.step for a minute
                envs.step_async(np.array([FaultyEnv.SLEEP, 0]), stage=0)
            stages = [1] if busy else [0, 1]
            actions = np.zeros(2, dtype=np.int64)
            steps = 0
            while True:
                for s in stages:
                    envs.step_async(actions, stage=s)
                for s in stages:
                    envs.step_wait(stage=s)
                steps += 1
                if steps == 20:
                    segments = envs.shared_memory_names
                    print(json.dumps({"segments": segments}), flush=True)
        finally:
            if cleanup:
                envs.close()

    if __name__ == "__main__":
        main(sys.argv[1] == "close", sys.argv[2] == "busy", sys.argv[3])
    """
)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Parent:
    """A parent script that steps a PipelinedVectorEnv until it is signalled."""

    def __init__(self, tmp_path: Path, cleanup: bool, busy: bool, on_sigterm: str = "default"):
        script = tmp_path / "parent.py"
        script.write_text(PARENT)
        self.stderr_path = tmp_path / "stderr.txt"
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(script),
                    "close" if cleanup else "no-close",
                    "busy" if busy else "idle",
                    on_sigterm,
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,  # a process group of its own, as a terminal gives
                # a foreground job gets Ctrl-C even when pytest itself was started in the
                # background by a non-interactive shell (which leaves SIGINT ignored)
                preexec_fn=_default_sigint,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the parent script failed:\n{self.stderr()}"
        self.segments: list[str] = json.loads(line)["segments"]
        self.descendants = psutil.Process(self.proc.pid).children(recursive=True)

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def alive_descendants(self) -> list[int]:
        alive = []
        for p in self.descendants:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def wait_descendants_gone(self) -> list[int]:
        """Poll (up to `GONE_WITHIN` s) until no descendant runs; return those left."""
        deadline = time.monotonic() + GONE_WITHIN
        while self.alive_descendants() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.alive_descendants()

    def segments_left(self) -> list[str]:
        deadline = time.monotonic() + GONE_WITHIN
        left = self.segments
        while left and time.monotonic() < deadline:
            left = [s for s in self.segments if os.path.exists(f"/dev/shm/{s}")]
            time.sleep(0.1)
        return left

    def cleanup(self) -> None:
        """Leave nothing behind, whatever the test found."""
        self.proc.kill()  # no-op once reaped
        for p in self.descendants:
            try:
                p.kill()  # psutil checks that the pid was not reused
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(timeout=GONE_WITHIN)
        for s in self.segments:
            if os.path.exists(f"/dev/shm/{s}"):
                os.unlink(f"/dev/shm/{s}")


@pytest.mark.parametrize(
    "cleanup,busy",
    [(False, False), (True, False), (False, True)],
    ids=["no-close", "close-in-finally", "worker-busy"],
)
def test_ctrl_c_gives_one_clean_traceback(tmp_path, cleanup, busy):
    parent = Parent(tmp_path, cleanup=cleanup, busy=busy)
    try:
        time.sleep(0.2)  # let it step a little more
        os.killpg(parent.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        parent.proc.wait(timeout=GONE_WITHIN)
        err = parent.stderr()
        assert err.count("Traceback (most recent call last)") == 1, err
        assert err.startswith("Traceback") and err.rstrip().endswith("KeyboardInterrupt"), err
        # a worker's traceback would be a second one, headed by its process name
        assert "Process pipelined-vec-env-worker" not in err, err
        assert "in worker_main" not in err and "in _serve" not in err, err
        assert parent.wait_descendants_gone() == []
        assert parent.segments_left() == []
    finally:
        parent.cleanup()


@pytest.mark.parametrize(
    "signum,on_sigterm",
    [(signal.SIGTERM, "default"), (signal.SIGKILL, "default"), (signal.SIGTERM, "exit")],
    ids=["SIGTERM", "SIGKILL", "SIGTERM-handler-exits"],
)
def test_parent_killed_while_a_worker_is_busy_leaves_no_process(tmp_path, signum, on_sigterm):
    """The dead parent is *not reaped* while we look (a launcher that reaps late): its
    workers must not rely on its pid disappearing, nor on finishing their step."""
    parent = Parent(tmp_path, cleanup=False, busy=True, on_sigterm=on_sigterm)
    try:
        assert len(parent.descendants) >= 4  # forkserver, resource tracker, workers
        parent.proc.send_signal(signum)
        assert parent.wait_descendants_gone() == []
        # the resource tracker unlinks what the dead parent could not
        assert parent.segments_left() == []
        parent.proc.wait(timeout=GONE_WITHIN)
        err = parent.stderr()
        assert "Process pipelined-vec-env-worker" not in err and "in _serve" not in err, err
    finally:
        parent.cleanup()
