"""`frames.py` with timing windows of different lengths in turn: how long should one be?

Every round runs ``frames.py`` once per ``--steps`` value, alternating, each run a fresh
subprocess with the same other arguments (after ``--``), so the host's drift falls on
every window length. Per length it gives each run's targets (ours ``step`` and
``copy=False`` against Sync) and how far the per-round ratios of ``step`` to Sync spread
within a run (largest over smallest): a window too short for the host's stalls shows as
a wider spread.

Run::

    python benchmarks/frames_windows.py --steps 60 300 --rounds 6 -- \\
        --envs 32 --sides 224 --cpu-cases --backends sync step nocopy --profile-case ""

Results go to ``benchmarks/results/frames_windows.json`` (each run's whole result under
``runs``) with a markdown table beside it.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import REPO, run_record, run_script, write_results  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "frames.py"
STEP, NO_COPY, SYNC = "ours step", "ours step copy=False", "gymnasium SyncVectorEnv"


@dataclass
class Args:
    """Options of the window comparison; what follows ``--`` goes to frames.py."""

    steps: tuple[int, ...] = (60, 300)
    """Window lengths (frames.py's ``--steps``) to compare."""
    rounds: int = 6
    """Rounds; each runs frames.py once per window length, in turn."""
    output: Path = REPO / "benchmarks" / "results" / "frames_windows.json"
    """Where the JSON goes (the markdown table beside it)."""
    frames_args: Annotated[tuple[str, ...], tyro.conf.Positional] = ()
    """Arguments for frames.py (after ``--``)."""


def summarize(result: dict[str, Any]) -> dict[str, float | None]:
    """One run's first case: ours ``step`` and ``copy=False`` against Sync (medians of
    per-round ratios, as frames.py gives them; None where not run) and the spread of the
    per-round ratios of ``step`` to Sync."""
    rows = {r["name"]: r for r in result["cases"][0]["rows"]}
    ratios = [
        a["steps_per_s"] / b["steps_per_s"]
        for a, b in zip(rows[STEP]["rounds"], rows[SYNC]["rounds"], strict=True)
    ]
    return {
        "step_vs_sync": rows[STEP]["vs_sync"],
        "copy_false_vs_sync": rows[NO_COPY]["vs_sync"] if NO_COPY in rows else None,
        "round_ratio_spread": max(ratios) / min(ratios),
    }


def results_table(result: dict[str, Any]) -> str:
    """A row per window length: each run's figures and their medians."""
    lines = [
        "| steps per window | ours step vs Sync (each run) | median | copy=False vs Sync "
        "(each run) | median | per-round spread of step / Sync (each run) | median |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for steps, runs in result["windows"].items():
        cells = []
        for key in ("step_vs_sync", "copy_false_vs_sync", "round_ratio_spread"):
            values = [r[key] for r in runs if r[key] is not None]
            median = f"{statistics.median(values):.2f}" if values else ""
            cells += [", ".join(f"{v:.2f}" for v in values), median]
        lines.append(f"| {steps} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the rounds, print and write the comparison."""
    args = tyro.cli(Args, args=argv)
    started, load_start = time.time(), os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    windows: dict[str, list[dict[str, float | None]]] = {str(s): [] for s in args.steps}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            for steps in args.steps:
                out = Path(scratch) / f"round{round_index}_steps{steps}.json"
                result = run_script(SCRIPT, [*args.frames_args, "--steps", str(steps)], out)
                runs.append(result)
                windows[str(steps)].append(summarize(result))
            print(f"round {round_index + 1}/{args.rounds} (load {os.getloadavg()[0]:.1f})")
    report = {
        "run": run_record(REPO, started, load_start, ["gymnasium", "numpy"]),
        "windows": windows,
        "runs": runs,
    }
    write_results(args.output, report, results_table(report))
    return report


if __name__ == "__main__":
    main()
