"""What `pipelined_vec_env.tune` reports: the `TuneResult`, its table of every layout
considered (predicted and measured env steps/s) and that table as text."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .layout_model import Layout
from .selection import rate

__all__ = ["TuneResult", "layout_kwargs", "record_rounds", "table_rows", "tune_result"]


@dataclass
class TuneResult:
    """The layout `tune` chose, with every layout it considered.

    Attributes:
        mode: ``"staged"`` (a round robin over stages with ``step_async``/``step_wait``)
            or ``"decoupled"`` (``async_reset``/``recv``/``send``).
        kwargs: Keyword arguments for `PipelinedVectorEnv` (``num_stages``,
            ``envs_per_worker``, ``worker_nice`` where the env has it, and the
            ``env_kwargs`` passed to `tune`).
        batch_size: The ``recv`` batch size in decoupled mode; None when staged.
        predicted_steps_per_s: The model's env steps/s for the chosen layout.
        measured_steps_per_s: Env steps/s of its short verification runs, the median over
            its rounds (None if it was not run: ``verify_top=0`` or no time left).
        table: One dict per layout considered, best predicted first: ``name``, ``mode``,
            ``kwargs``, ``batch_size``, ``predicted``, ``measured`` (steps/s, the median
            of ``rounds``; None where not run) and ``rounds`` (the env steps/s of each of
            its verification runs, in order; empty where not run).
        measurements: What the model was fed: ``step_ms`` (median, p90, p99 and mean of
            the step time), ``cpu_fraction`` (mean), ``message_latency_us``,
            ``message_cpu_us``, ``policy_ms`` (batch size -> wall ms), ``cores``,
            ``slice_ms`` (the scheduler's time slice the model used; None off Linux).
        seconds: Wall time `tune` took.
    """

    mode: str
    kwargs: dict[str, Any]
    batch_size: int | None
    predicted_steps_per_s: float
    measured_steps_per_s: float | None
    table: list[dict[str, Any]]
    measurements: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def format_table(self) -> str:
        """The table as aligned text, the chosen layout marked with ``*``."""
        names = []
        for row in self.table:
            chosen = (
                row["mode"] == self.mode
                and row["batch_size"] == self.batch_size
                and row["kwargs"] == self.kwargs
            )
            names.append(row["name"] + (" *" if chosen else ""))
        width = max([len("layout"), *map(len, names)])
        lines = [f"{'layout':<{width}} {'predicted':>10} {'measured':>10}"]
        for name, row in zip(names, self.table, strict=True):
            measured = "-" if row["measured"] is None else f"{row['measured']:.0f}"
            lines.append(f"{name:<{width}} {row['predicted']:>10.0f} {measured:>10}")
        return "\n".join(lines)


def layout_kwargs(layout: Layout, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The `PipelinedVectorEnv` keyword arguments that run ``layout`` with ``env_kwargs``
    (whose ``worker_nice``, when set, wins over the layout's)."""
    return {
        "num_stages": layout.num_stages,
        "envs_per_worker": layout.envs_per_worker,
        "worker_nice": env_kwargs.get("worker_nice", layout.worker_nice),
        **{k: v for k, v in env_kwargs.items() if k != "worker_nice"},
    }


def table_rows(
    ranked: list[tuple[Layout, float]], env_kwargs: dict[str, Any]
) -> list[dict[str, Any]]:
    """`TuneResult.table`'s rows of the ``ranked`` layouts (best predicted first, with their
    predicted env steps/s), none measured yet."""
    return [
        {
            "name": layout.name,
            "mode": layout.mode,
            "kwargs": layout_kwargs(layout, env_kwargs),
            "batch_size": layout.batch_size,
            "predicted": predicted,
            "measured": None,
            "rounds": [],
        }
        for layout, predicted in ranked
    ]


def record_rounds(
    table: list[dict[str, Any]],
    per_round: Mapping[Layout, list[float]],
) -> None:
    """Write each layout run's env steps/s per round (``rounds``) and its rate (``measured``:
    `selection.rate`, their median) into its row of ``table``."""
    for layout, rounds in per_round.items():
        row = next(r for r in table if r["name"] == layout.name)
        row["measured"] = rate(rounds)
        row["rounds"] = rounds


def tune_result(
    table: list[dict[str, Any]],
    winner: Layout | None,
    measurements: dict[str, Any],
    seconds: float,
) -> TuneResult:
    """The `TuneResult` choosing ``winner`` (None: the best predicted, ``table[0]``)."""
    best = table[0] if winner is None else next(r for r in table if r["name"] == winner.name)
    return TuneResult(
        mode=best["mode"],
        kwargs=dict(best["kwargs"]),
        batch_size=best["batch_size"],
        predicted_steps_per_s=best["predicted"],
        measured_steps_per_s=best["measured"],
        table=table,
        measurements=measurements,
        seconds=seconds,
    )
