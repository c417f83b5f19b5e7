"""The candidate grid of `tune`: the layouts it predicts (stage counts x envs per worker,
decoupled batch sizes, worker priorities), and the policy batch sizes those layouts call.
"""

from __future__ import annotations

import dataclasses
import math

from .arguments import TuneArguments
from .layout_model import Layout

__all__ = [
    "NICED_WORKERS",
    "candidate_layouts",
    "policy_sizes",
    "powers_of_two",
    "with_nices",
    "worker_nices",
]

#: The workers' nice value `tune` also considers when the envs oversubscribe the cores
#: (measured on the overlap benchmark's workload: see ``docs/benchmarks_rollout.md``).
NICED_WORKERS = 10


def powers_of_two(n: int) -> list[int]:
    """The powers of two up to ``n``, and ``n``: the default stage counts and batch sizes."""
    values = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return sorted({*values, n})


def candidate_layouts(
    num_envs: int,
    modes: tuple[str, ...],
    num_stages: tuple[int, ...] | None,
    envs_per_worker: tuple[int, ...] | None,
    batch_sizes: tuple[int, ...] | None,
) -> list[Layout]:
    """Every layout of ``num_envs`` envs `tune` predicts, before worker priorities (each
    sequence None: its default), without repeats: staged, each stage count by envs per
    worker (1 and the whole stage by default); decoupled, each ``recv`` batch size."""
    layouts: list[Layout] = []
    if "staged" in modes:
        for s in num_stages or powers_of_two(num_envs):
            stage_size = math.ceil(num_envs / s)
            per_worker = envs_per_worker or (1, stage_size)
            for e in sorted({min(e, stage_size) for e in per_worker}):
                layouts.append(Layout("staged", s, e))
    if "decoupled" in modes:
        for b in batch_sizes or powers_of_two(num_envs):
            layouts.append(Layout("decoupled", 1, 1, b))
    return list(dict.fromkeys(layouts))


def policy_sizes(num_envs: int, layouts: list[Layout]) -> list[int]:
    """The batch sizes the policy is timed at: those the layouts call it with."""
    return sorted(
        {
            *(b for layout in layouts if layout.batch_size for b in (layout.batch_size,)),
            *(math.ceil(num_envs / layout.num_stages) for layout in layouts),
            *(num_envs // layout.num_stages for layout in layouts),
            1,
            num_envs,
        }
    )


def worker_nices(
    search: TuneArguments, demand: float, cores: float
) -> tuple[int | str | None, ...]:
    """The workers' nice values to predict: ``worker_nice`` as given; else
    `NICED_WORKERS` too when the envs' CPU ``demand`` (cores) reaches the ``cores`` got."""
    if "worker_nice" in search.env_kwargs:
        return (None,)
    if search.worker_nice is not None:
        return search.worker_nice
    # against the cores we got (at least one: a tiny share measured in a loaded moment must
    # not make sleeping envs look CPU-bound)
    return (None, NICED_WORKERS) if demand >= max(1.0, cores) else (None,)


def with_nices(layouts: list[Layout], nices: tuple[int | str | None, ...]) -> list[Layout]:
    """Every layout of ``layouts`` at each of the workers' nice values ``nices``."""
    return [
        layout if nice is None else dataclasses.replace(layout, worker_nice=nice)
        for nice in nices
        for layout in layouts
    ]
