"""The constructor arguments of `PipelinedVectorEnv`: checked, normalised and laid out.

`check_arguments` validates the keyword arguments before any worker starts (every error a
`ValueError` naming the argument and what it expects) and returns them as one frozen
`VectorEnvArguments`, with the layout of envs into stages and workers computed from them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import Env, Space
from gymnasium.vector import AutoresetMode

from .shared_memory import SHM_FALLBACKS
from .stepping.stages import split_range

__all__ = ["VectorEnvArguments", "check_arguments", "default_envs_per_worker", "usable_cores"]

# (stage, [(env_lo, env_hi) per worker]) per stage
Layout = list[tuple[int, list[tuple[int, int]]]]


class ArgumentField:
    """A read-only attribute of the vector env, read from the `VectorEnvArguments` it holds
    (``envs.arguments``): ``envs.num_stages`` is ``envs.arguments.num_stages``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.arguments, self.name)


@dataclass(frozen=True)
class VectorEnvArguments:
    """The checked and normalised arguments of one `PipelinedVectorEnv`.

    The meaning of each argument is documented on `PipelinedVectorEnv`; here ints are
    plain ints, seconds are floats and `autoreset_mode` is an `AutoresetMode`.

    Attributes:
        env_fns: One constructor per env (a list).
        num_envs: `len(env_fns)`.
        num_stages: Stages, in `[1, num_envs]`.
        envs_per_worker: Envs per worker process, `>= 1`.
        max_restarts: Restarts allowed per worker, `>= 0`.
        step_deadline: Seconds a worker may take per command, or None.
        start_timeout: Seconds a worker may take to start (finite, `> 0`).
        worker_threads: Thread cap inside each worker, or None.
        worker_nice: None, `"idle"` or an int in `[-20, 19]`.
        info_layout: `"batched"` or `"per_env"`.
        backend: `"multiprocessing"` or `"ray"`.
        ray_options: Ray options (None unless `backend="ray"`).
        cpu_affinity: None, `"auto"` or one core set per worker.
        observation_mode: `"same"`, `"different"` or `(batched_space, single_space)`.
        autoreset_mode: The autoreset mode.
        shared_memory: Whether observations go through shared memory (the caller's wish,
            False with Ray).
        shm_fallback: `"file"` or `"error"` (observation buffers too big for /dev/shm).
        layout: Per stage, its index and each worker's `(env_lo, env_hi)` range: envs
            split over stages like `np.array_split`, each stage's envs over
            `ceil(stage_size / envs_per_worker)` workers the same way.
        stage_slices: Each stage's envs, as a slice of global env indices.
    """

    env_fns: list[Callable[[], Env]]
    num_envs: int
    num_stages: int
    envs_per_worker: int
    max_restarts: int
    step_deadline: float | None
    start_timeout: float
    worker_threads: int | None
    worker_nice: int | str | None
    info_layout: str
    backend: str
    ray_options: Any
    cpu_affinity: str | Sequence[Sequence[int]] | None
    observation_mode: str | tuple[Space, Space]
    autoreset_mode: AutoresetMode
    shared_memory: bool
    shm_fallback: str
    layout: Layout
    stage_slices: tuple[slice, ...]


def check_arguments(
    env_fns: Sequence[Callable[[], Env]],
    *,
    num_stages: Any,
    envs_per_worker: Any,
    max_restarts: Any,
    step_deadline: Any,
    start_timeout: Any,
    worker_threads: Any,
    worker_nice: Any,
    info_layout: Any,
    backend: Any,
    ray_options: Any,
    cpu_affinity: Any,
    observation_mode: Any,
    autoreset_mode: Any,
    shared_memory: bool,
    shm_fallback: Any = "file",
) -> VectorEnvArguments:
    """Check the constructor arguments of `PipelinedVectorEnv` and normalise them.

    Args:
        env_fns: One constructor per env.
        num_stages: See `PipelinedVectorEnv`; likewise every other argument.
        envs_per_worker: Envs per worker, or None for `default_envs_per_worker`.
        max_restarts: Restarts per worker.
        step_deadline: Seconds per command, or None.
        start_timeout: Seconds to start a worker.
        worker_threads: Thread cap, or None.
        worker_nice: Nice value, `"idle"` or None.
        info_layout: `"batched"` or `"per_env"`.
        backend: `"multiprocessing"` or `"ray"`.
        ray_options: Ray options, or None.
        cpu_affinity: Core sets, `"auto"` or None.
        observation_mode: `"same"`, `"different"` or a pair of spaces.
        autoreset_mode: An `AutoresetMode` or its string value.
        shared_memory: Whether the caller wants shared memory.
        shm_fallback: `"file"` or `"error"`.

    Returns:
        The arguments, checked and normalised, with the layout.

    Raises:
        ValueError: An argument out of its domain (named, with what it expects); checked
            in the order of the arguments above, before any worker is touched.
    """
    env_fns = list(env_fns)
    if not env_fns or not all(callable(fn) for fn in env_fns):
        raise ValueError("env_fns: expected a non-empty sequence of callables returning envs")
    num_envs = len(env_fns)
    if not isinstance(num_stages, (int, np.integer)) or not 1 <= num_stages <= num_envs:
        raise ValueError(f"num_stages: expected an int in [1, {num_envs}], got {num_stages!r}")
    if envs_per_worker is None:
        envs_per_worker = default_envs_per_worker(num_envs, int(num_stages))
    if (
        isinstance(envs_per_worker, bool)
        or not isinstance(envs_per_worker, (int, np.integer))
        or envs_per_worker < 1
    ):
        raise ValueError(f"envs_per_worker: expected None or an int >= 1, got {envs_per_worker!r}")
    if not isinstance(max_restarts, (int, np.integer)) or max_restarts < 0:
        raise ValueError(f"max_restarts: expected an int >= 0, got {max_restarts!r}")
    if step_deadline is not None and not step_deadline > 0:
        raise ValueError(f"step_deadline: expected None or seconds > 0, got {step_deadline!r}")
    if (
        isinstance(start_timeout, bool)
        or not isinstance(start_timeout, (int, float, np.integer, np.floating))
        or not 0 < start_timeout < float("inf")
    ):
        raise ValueError(f"start_timeout: expected finite seconds > 0, got {start_timeout!r}")
    if worker_threads is not None and (not isinstance(worker_threads, int) or worker_threads < 1):
        raise ValueError(f"worker_threads: expected None or an int >= 1, got {worker_threads!r}")
    _check_worker_nice(worker_nice)
    if info_layout not in ("batched", "per_env"):
        raise ValueError(f"info_layout: expected 'batched' or 'per_env', got {info_layout!r}")
    _check_backend(backend, ray_options, cpu_affinity)
    if not (
        observation_mode in ("same", "different")
        or (isinstance(observation_mode, tuple) and len(observation_mode) == 2)
    ):
        raise ValueError(
            "observation_mode: expected 'same', 'different' or a tuple "
            f"(batched_space, single_space), got {observation_mode!r}"
        )
    if shm_fallback not in SHM_FALLBACKS:
        raise ValueError(f"shm_fallback: expected 'file' or 'error', got {shm_fallback!r}")
    autoreset_mode = (
        autoreset_mode
        if isinstance(autoreset_mode, AutoresetMode)
        else AutoresetMode(autoreset_mode)
    )
    layout = worker_layout(num_envs, int(num_stages), int(envs_per_worker))
    return VectorEnvArguments(
        env_fns=env_fns,
        num_envs=num_envs,
        num_stages=int(num_stages),
        envs_per_worker=int(envs_per_worker),
        max_restarts=int(max_restarts),
        step_deadline=step_deadline,
        start_timeout=float(start_timeout),
        worker_threads=worker_threads,
        worker_nice=worker_nice if worker_nice in (None, "idle") else int(worker_nice),
        info_layout=info_layout,
        backend=backend,
        ray_options=ray_options,
        cpu_affinity=cpu_affinity,
        observation_mode=observation_mode,
        autoreset_mode=autoreset_mode,
        # envs may live on other machines: observations travel through Ray's object store
        shared_memory=shared_memory and backend == "multiprocessing",
        shm_fallback=shm_fallback,
        layout=layout,
        stage_slices=tuple(slice(w[0][0], w[-1][1]) for _, w in layout),
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), `>= 1`.

    Returns:
        `len(os.sched_getaffinity(0))` where the platform has it, else `os.cpu_count()`.
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def default_envs_per_worker(num_envs: int, num_stages: int, cores: int | None = None) -> int:
    """The envs per worker used when `envs_per_worker` is not given: about one worker
    per usable core in each stage.

    Each stage gets `min(stage_size, cores)` workers, and each worker steps
    `ceil(stage_size / workers)` envs per message. Stages exist so that the policy infers
    on one stage while the others step: a stage that steps while the others wait on the
    policy can then use every core. Fewer, fuller workers amortise one message over
    several env steps; the price is that a crash in a worker ends the episodes of all its
    envs, and that each worker's memory holds all its envs. With several stages there are
    up to `num_stages * cores` workers: when every stage steps at once (a policy that
    costs next to nothing) they share the cores, which light envs pay for in messages
    (``benchmarks/default_layout.py`` measures both kinds of env).

    Args:
        num_envs: Envs in all, `>= 1`.
        num_stages: Stages, in `[1, num_envs]`.
        cores: Usable cores; default `usable_cores()`.

    Returns:
        Envs per worker, `>= 1`, computed for the largest stage.

    Examples:
        >>> default_envs_per_worker(8, 1, cores=2)
        4
        >>> default_envs_per_worker(32, 2, cores=2)
        8
        >>> default_envs_per_worker(4, 1, cores=16)
        1
    """
    cores = usable_cores() if cores is None else max(1, int(cores))
    stage_size = -(-num_envs // num_stages)
    workers = min(stage_size, cores)
    return -(-stage_size // workers)


def worker_layout(num_envs: int, num_stages: int, envs_per_worker: int) -> Layout:
    """Split `num_envs` envs into stages, then each stage's envs into workers.

    Args:
        num_envs: Envs in all.
        num_stages: Stages, in `[1, num_envs]`.
        envs_per_worker: Most envs per worker, `>= 1`.

    Returns:
        Per stage, `(stage, [(env_lo, env_hi) per worker])`: contiguous ranges whose sizes
        differ by at most one, `ceil(stage_size / envs_per_worker)` workers per stage.
    """
    layout: Layout = []
    for s, (lo, hi) in enumerate(split_range(0, num_envs, num_stages)):
        n_workers = -(-(hi - lo) // envs_per_worker)
        layout.append((s, split_range(lo, hi, n_workers)))
    return layout


def _check_worker_nice(worker_nice: Any) -> None:
    if (
        worker_nice is not None
        and worker_nice != "idle"
        and (
            isinstance(worker_nice, bool)
            or not isinstance(worker_nice, (int, np.integer))
            or not -20 <= worker_nice <= 19
        )
    ):
        raise ValueError(
            f"worker_nice: expected None, 'idle' or an int in [-20, 19], got {worker_nice!r}"
        )


def _check_backend(backend: Any, ray_options: Any, cpu_affinity: Any) -> None:
    if backend not in ("multiprocessing", "ray"):
        raise ValueError(f"backend: expected 'multiprocessing' or 'ray', got {backend!r}")
    if backend != "ray" and ray_options is not None:
        raise ValueError("ray_options: only used with backend='ray'")
    if backend == "ray" and cpu_affinity is not None:
        raise ValueError(
            "cpu_affinity: not available with backend='ray' (Ray places the actors; "
            "reserve CPUs with ray_options num_cpus)"
        )
