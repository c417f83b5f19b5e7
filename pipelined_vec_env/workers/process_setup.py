"""A worker process's set-up: tying its life to the caller's, capping its threads, pinning
its cores and setting its nice value, before (and while) it serves its envs.

All of it runs inside the worker (a subprocess or a Ray actor); nothing here talks to the
caller. [`worker.worker_main`][pipelined_vec_env.workers.worker.worker_main] calls it at
start-up, and the Ray actor the thread caps.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from typing import Any

from gymnasium import Env

__all__ = [
    "THREAD_ENV_VARS",
    "NicedEnvFn",
    "die_with_parent",
    "limit_threads",
    "limit_torch_threads",
    "parent_alive",
    "release_forkserver",
    "set_affinity",
    "set_worker_nice",
    "watch_parent",
]

logger = logging.getLogger(__name__)

#: Environment variables that cap native thread pools inside each worker.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)

_PR_SET_PDEATHSIG = 1
_PARENT_CHECK_SECONDS = 1.0


def die_with_parent() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies (covers busy/hung workers).

    Returns:
        False if the parent died before the request took effect (it will never fire).
    """
    if not sys.platform.startswith("linux"):
        return True
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable")
    return os.getppid() == parent


def release_forkserver() -> None:
    """Close this worker's copy of the forkserver's "alive" pipe, if it has one.

    The forkserver exits when every holder of that pipe's write end is gone, and it hands
    a copy to each child it forks. So while any worker lives, the forkserver outlives a
    caller that died, and ``PR_SET_PDEATHSIG`` (which fires when the worker's parent, the
    *forkserver*, dies) never fires: a busy or hung worker of a dead caller would live on
    until its step ends. Without the copy, the caller's death ends the forkserver at once
    and, through ``PR_SET_PDEATHSIG``, every worker. A forkserver child never uses the copy
    itself (it starts a forkserver of its own if it needs one).
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    started_by_forkserver = getattr(server, "_inherited_fds", None) is not None
    if fd is None or not started_by_forkserver or getattr(server, "_forkserver_pid", 1) is not None:
        return
    server._forkserver_alive_fd = None
    try:
        os.close(fd)
    except OSError:
        logger.debug("could not close the forkserver's alive fd %d", fd)


def parent_alive(parent_pid: int) -> bool:
    """Whether the process ``parent_pid`` still exists (one we may not signal counts)."""
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def limit_threads(worker_threads: int | None) -> None:
    """Cap OpenMP/BLAS thread pools at ``worker_threads`` (`THREAD_ENV_VARS`, and
    ``threadpoolctl`` where installed); None leaves them alone."""
    if worker_threads is None:
        return
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(worker_threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(worker_threads)


def limit_torch_threads(worker_threads: int | None) -> None:
    """Cap torch's intra-op threads at ``worker_threads`` if torch is loaded (call it after
    building the envs, which may import torch); None leaves them alone."""
    torch = sys.modules.get("torch")
    if worker_threads is not None and torch is not None:
        torch.set_num_threads(worker_threads)


def set_affinity(cores: tuple[int, ...] | None) -> None:
    """Pin this process to ``cores`` (``os.sched_setaffinity``, Linux only: elsewhere a
    warning); None leaves it alone."""
    if cores is None:
        return
    if not hasattr(os, "sched_setaffinity"):
        logger.warning("cpu_affinity is ignored: os.sched_setaffinity is Linux-only")
        return
    os.sched_setaffinity(0, cores)


def set_worker_nice(nice: int | str) -> None:
    """Set this process's nice value to ``nice`` (absolute, ``setpriority``; POSIX only),
    or with ``"idle"`` put it in Linux's ``SCHED_IDLE`` class (it runs only when no normal
    task wants the core, and a waking normal task preempts it at once).

    Raises:
        PermissionError: ``nice`` is below the current value and the process may not raise
            its priority (Linux: needs ``CAP_SYS_NICE`` or ``RLIMIT_NICE``).
    """
    if nice == "idle":
        if not hasattr(os, "SCHED_IDLE"):
            logger.warning("worker_nice='idle' is ignored: SCHED_IDLE is Linux-only")
            return
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    if not hasattr(os, "setpriority"):
        logger.warning("worker_nice is ignored: os.setpriority is POSIX-only")
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(nice))
    except PermissionError as exc:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        raise PermissionError(
            f"worker_nice={nice}: this worker (nice {current}) may not raise its priority "
            "(needs CAP_SYS_NICE or RLIMIT_NICE); use a value >= the caller's nice"
        ) from exc


class NicedEnvFn:
    """An env constructor that first sets its worker process's nice value.

    `WorkerPool.spawn` wraps the first constructor of each worker in it when
    ``worker_nice`` is set, so the value is applied inside the worker process before its
    envs are built, at start-up and at every rebuild (a restart calls the constructors
    again), for the multiprocessing and the Ray backend alike.

    Args:
        env_fn: The real constructor.
        nice: Absolute nice value, in ``[-20, 19]``, or ``"idle"`` (``SCHED_IDLE``).
    """

    def __init__(self, env_fn: Any, nice: int | str) -> None:
        self.env_fn = env_fn
        self.nice = nice

    def __call__(self) -> Env:
        set_worker_nice(self.nice)
        return self.env_fn()


def watch_parent(parent_pid: int) -> None:
    """Exit this worker once the caller's process is gone (covers an idle worker whose
    pipe stays open, e.g. because an env's own child process inherited it)."""
    while parent_alive(parent_pid):
        time.sleep(_PARENT_CHECK_SECONDS)
    os._exit(0)
