"""`tune`'s arguments, checked in the order of its signature before any worker starts, and
kept as one `TuneArguments` (the sequences sorted, without repeats).

Bad input raises ``ValueError`` naming the argument and what it expects.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import Env

from ..vector_env import PipelinedVectorEnv
from ..workers.spinning import usable_cores

__all__ = [
    "LAYOUT_KWARGS",
    "MODES",
    "TuneArguments",
    "check_ints",
    "check_nices",
    "check_tune_arguments",
    "positive_seconds",
]

#: The modes `tune` may consider.
MODES = ("staged", "decoupled")
#: Chosen by `tune`, so not accepted in ``env_kwargs``.
LAYOUT_KWARGS = ("num_stages", "envs_per_worker")


@dataclass(frozen=True)
class TuneArguments:
    """`tune`'s arguments, checked (the sequences sorted, without repeats)."""

    modes: tuple[str, ...]
    num_stages: tuple[int, ...] | None
    envs_per_worker: tuple[int, ...] | None
    batch_sizes: tuple[int, ...] | None
    verify_top: int
    verify_close: float
    verify_rounds: int
    verify_max: int
    worker_nice: tuple[int | str | None, ...] | None
    probe_steps: int
    probe_seconds: float
    verify_seconds: float
    cores: int
    seed: int
    env_kwargs: dict[str, Any]


def check_tune_arguments(
    env_fns: Any, policy: Any, *, modes: Any, cores: Any, env_kwargs: Any, **kw: Any
) -> tuple[list[Callable[[], Env]], TuneArguments]:
    """`tune`'s arguments checked, in the order of its signature, before any worker starts.

    Raises:
        ValueError: The first bad argument, named.
    """
    env_fns = list(env_fns) if isinstance(env_fns, Sequence) else env_fns
    if not isinstance(env_fns, list) or not env_fns or not all(callable(f) for f in env_fns):
        raise ValueError("env_fns: expected a non-empty sequence of callables returning envs")
    if not callable(policy):
        raise ValueError(f"policy: expected a callable policy(obs) -> actions, got {policy!r}")
    n = len(env_fns)
    modes = tuple(modes) if not isinstance(modes, str) else (modes,)
    if not modes or any(m not in MODES for m in modes):
        raise ValueError(f"modes: expected a non-empty subset of {MODES}, got {modes!r}")
    stage_counts = check_ints("num_stages", kw["num_stages"], 1, n)
    per_worker = check_ints("envs_per_worker", kw["envs_per_worker"], 1, None)
    sizes = check_ints("batch_sizes", kw["batch_sizes"], 1, n)
    check_ints("verify_top", kw["verify_top"], 0, None)
    check_ints("verify_rounds", kw["verify_rounds"], 1, None)
    check_ints("verify_max", kw["verify_max"], 1, None)
    verify_close = kw["verify_close"]
    if (
        isinstance(verify_close, bool)
        or not isinstance(verify_close, (int, float, np.integer, np.floating))
        or not 0 <= verify_close < 1
    ):
        raise ValueError(f"verify_close: expected a fraction in [0, 1), got {verify_close!r}")
    nices = check_nices(kw["worker_nice"])
    check_ints("probe_steps", kw["probe_steps"], 1, None)
    probe_seconds = positive_seconds("probe_seconds", kw["probe_seconds"])
    verify_seconds = positive_seconds("verify_seconds", kw["verify_seconds"])
    if cores is not None:
        check_ints("cores", cores, 1, None)
    env_kwargs = dict(env_kwargs or {})
    accepted = inspect.signature(PipelinedVectorEnv).parameters
    unknown = [k for k in env_kwargs if k not in accepted or k == "env_fns"]
    chosen = [k for k in env_kwargs if k in LAYOUT_KWARGS]
    if unknown or chosen:
        raise ValueError(
            f"env_kwargs: expected PipelinedVectorEnv arguments other than env_fns, "
            f"num_stages and envs_per_worker, got {sorted(unknown + chosen)}"
        )
    if env_kwargs.get("backend", "multiprocessing") != "multiprocessing":
        raise ValueError("env_kwargs: tune supports backend='multiprocessing' only")
    return env_fns, TuneArguments(
        modes=modes,
        num_stages=stage_counts,
        envs_per_worker=per_worker,
        batch_sizes=sizes,
        verify_top=kw["verify_top"],
        verify_close=verify_close,
        verify_rounds=kw["verify_rounds"],
        verify_max=kw["verify_max"],
        worker_nice=nices,
        probe_steps=kw["probe_steps"],
        probe_seconds=probe_seconds,
        verify_seconds=verify_seconds,
        cores=int(cores) if cores is not None else usable_cores(),
        seed=kw["seed"],
        env_kwargs=env_kwargs,
    )


def check_nices(worker_nice: Any) -> tuple[int | str | None, ...] | None:
    """``worker_nice`` as a tuple without repeats (None: `tune` decides)."""
    if worker_nice is None:
        return None
    values = tuple(worker_nice) if isinstance(worker_nice, (list, tuple)) else (worker_nice,)
    if not values or not all(
        v is None
        or v == "idle"
        or (not isinstance(v, bool) and isinstance(v, (int, np.integer)) and -20 <= v <= 19)
        for v in values
    ):
        raise ValueError(
            f"worker_nice: expected a non-empty sequence of None, 'idle' or ints in "
            f"[-20, 19], got {worker_nice!r}"
        )
    return tuple(dict.fromkeys(v if v is None or v == "idle" else int(v) for v in values))


def check_ints(name: str, values: Any, low: int, high: int | None) -> tuple[int, ...] | None:
    """``values`` (an int or a sequence of them, each in ``[low, high]``; ``high`` None: no
    bound) sorted, without repeats; None stays None.

    Raises:
        ValueError: An empty sequence, a non-int (a bool too) or one out of bounds; the
            message names ``name``.
    """
    if values is None:
        return None
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    bad = [
        v
        for v in values
        if isinstance(v, bool)
        or not isinstance(v, (int, np.integer))
        or v < low
        or (high is not None and v > high)
    ]
    if not values or bad:
        span = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}: expected a non-empty sequence of ints in {span}, got {values!r}")
    return tuple(sorted({int(v) for v in values}))


def positive_seconds(name: str, value: Any) -> float:
    """``value`` as float seconds.

    Raises:
        ValueError: Not a finite number > 0 (a bool neither); the message names ``name``.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not 0 < value < math.inf
    ):
        raise ValueError(f"{name}: expected finite seconds > 0, got {value!r}")
    return float(value)
