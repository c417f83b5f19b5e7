"""Helpers for fault tests of code built on a `PipelinedVectorEnv`.

A trainer's or wrapper's handling of a dead worker is tested by killing one from outside,
as the OOM killer or a segfault in native code would, then driving the env as usual::

    from pipelined_vec_env.testing import kill_worker

    envs = PipelinedVectorEnv(env_fns, num_stages=2, max_restarts=1)
    envs.reset(seed=0)
    kill_worker(envs, 1)  # SIGKILL worker 1 and wait until its process is gone
    obs, rewards, terms, truncs, infos = envs.step(actions)  # its envs: truncated, restarted

``envs.workers[i]`` is worker ``i``'s handle (``pid``, ``env_indices``, ``stage``,
``restarts``); `kill_worker` takes the same global index.
"""

from __future__ import annotations

import os
import signal as signals
from multiprocessing.connection import wait
from typing import TYPE_CHECKING

from gymnasium.error import ClosedEnvironmentError

if TYPE_CHECKING:
    from .vector_env import PipelinedVectorEnv

__all__ = ["kill_worker"]


def kill_worker(
    envs: PipelinedVectorEnv,
    index: int,
    signal: int = signals.SIGKILL,
    *,
    timeout: float = 30.0,
) -> int:
    """Send ``signal`` to worker ``index``'s process and wait until the process has exited.

    Nothing of the env is touched: it notices the death at its next wait on that worker,
    as for any crash (`WorkerCrashedError`, or a restart while ``max_restarts`` allows).

    Args:
        envs: An open vector env with subprocess workers (``backend="multiprocessing"``).
        index: The worker's global index, in ``[0, len(envs.workers))`` (stages, then
            workers within a stage, as ``envs.workers``).
        signal: The signal (``signal.SIGKILL``, ``signal.SIGTERM``, ``signal.SIGSEGV``,
            ...). Workers ignore ``SIGINT`` (Ctrl-C is the caller's), so it times out.
        timeout: Seconds to wait for the process to exit.

    Returns:
        The killed process's id.

    Raises:
        ClosedEnvironmentError: ``envs`` is closed.
        NotImplementedError: Ray workers (``ray.kill(envs.workers[index].actor)`` kills
            an actor).
        IndexError: ``index`` is not a worker's.
        RuntimeError: The worker's process has exited already.
        TimeoutError: The process still runs ``timeout`` seconds after the signal.
    """
    if envs.closed:
        raise ClosedEnvironmentError("kill_worker: the vector env is closed")
    if envs.backend != "multiprocessing":
        raise NotImplementedError(
            f"kill_worker: subprocess workers only, got backend={envs.backend!r}; "
            "ray.kill(envs.workers[index].actor) kills a Ray actor"
        )
    workers = envs.workers
    if isinstance(index, bool) or not 0 <= index < len(workers):
        raise IndexError(f"index: expected a worker index in [0, {len(workers)}), got {index!r}")
    worker = workers[index]
    if wait([worker.sentinel], 0):
        raise RuntimeError(f"kill_worker: worker {index} has exited already")
    pid = worker.pid
    assert pid is not None  # a started process
    os.kill(pid, signal)  # an exited but unreaped child keeps its pid: never another's
    if not wait([worker.sentinel], timeout):
        try:
            name = signals.Signals(signal).name
        except ValueError:
            name = f"signal {signal}"
        raise TimeoutError(
            f"kill_worker: worker {index} (pid {pid}) still runs {timeout} s after {name}"
        )
    return pid
