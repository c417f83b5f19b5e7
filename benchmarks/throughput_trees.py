"""`throughput.py` on two package trees in turn: is one commit's core slower than another's?

Every round runs ``throughput.py`` once per tree, alternating, each run in a fresh
subprocess whose ``PYTHONPATH`` starts with that tree (a directory holding a
``pipelined_vec_env`` package, e.g. ``mkdir -p /tmp/base && git archive <commit>
pipelined_vec_env | tar -x -C /tmp/base``; ``.`` is this checkout). The script is this checkout's in both, so the same
backends are timed the same way and only the package differs. Each run's own
``SyncVectorEnv`` is the yardstick: a row's ``vs Sync`` in one run divided by the same
row's in the other tree's run of that round is one paired ratio. The table gives, per
row, three medians over rounds of such later / earlier ratios: of env steps/s, of
``vs Sync`` and of CPU time per env step (the caller's and the workers'; the steadiest of
the three on a loaded host, as wall times move with whatever else the host runs). Above 1
is faster for the first two, below 1 cheaper for the third. Null-env rows compare the
wall time of a worker round trip and the CPU per env step the same way.

Give explicit layouts (``--configs 1x1 1x2 ...``): ``default`` means whatever each
commit's default layout is, which is a change of default, not of cost.

Run::

    mkdir -p /tmp/base && git archive 6c7c4c9 pipelined_vec_env | tar -x -C /tmp/base
    python benchmarks/throughput_trees.py --trees /tmp/base . --rounds 8 -- \\
        --only throughput null --rounds 1 --configs 1x1 1x2 1x4 2x2 2x4 --send-recv 2x2 \\
        --no-envpool

Short throughput.py runs (``--rounds 1``) in many rounds alternate the trees more often,
so the host's drift (on a shared VM, whole minutes faster or slower) falls on both.

Results go to ``benchmarks/results/throughput_trees.json`` with a markdown table beside
it: ``trees`` as given, ``packages`` the file each tree's package was imported from (the
tree's folder name and the path in it: proof that each run used its tree), ``comparison``,
and each run's whole result under ``runs`` (whose own ``run`` record names this
checkout's commit: the script's, not the tree's).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import (  # noqa: E402
    REPO,
    python_in_tree,
    relative_paths,
    run_record,
    run_script,
    tree_environ,
    write_results,
)

SCRIPT = Path(__file__).resolve().parent / "throughput.py"
#: Prints where ``pipelined_vec_env`` is imported from (shows which tree a run used).
PACKAGE_PATH = "import pipelined_vec_env as p; print(p.__file__)"


@dataclass
class Args:
    """Options of the two-tree comparison; what follows ``--`` goes to throughput.py."""

    trees: tuple[Path, Path]
    """The earlier tree, then the later one (each holds a ``pipelined_vec_env`` package)."""
    rounds: int = 3
    """Rounds; each runs throughput.py once per tree, in turn."""
    output: Path = REPO / "benchmarks" / "results" / "throughput_trees.json"
    """Where the JSON goes (the markdown table beside it)."""
    throughput_args: Annotated[tuple[str, ...], tyro.conf.Positional] = ()
    """Arguments for throughput.py (after ``--``)."""


def run_tree(tree: Path, throughput_args: Sequence[str], output: Path) -> dict[str, Any]:
    """One run of throughput.py with ``tree`` first on ``PYTHONPATH``; its JSON result,
    with ``package``: the file the tree's package was imported from, as the tree's folder
    name and the path inside it (``base/pipelined_vec_env/__init__.py``).

    Raises:
        RuntimeError: the run failed (the end of its stderr is in the message), or the
            package was not imported from ``tree``.
    """
    result = run_script(SCRIPT, throughput_args, output, tree_environ(tree))
    imported = Path(python_in_tree(tree, PACKAGE_PATH, check=True).stdout.strip()).resolve()
    root = tree.resolve()
    if not imported.is_relative_to(root):
        raise RuntimeError(f"with {tree} first on PYTHONPATH, the package came from {imported}")
    result["package"] = str(Path(root.name) / imported.relative_to(root))
    return result


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _median_ratio(pairs: Iterable[tuple[float | None, float | None]]) -> float | None:
    return _median(b / a for a, b in pairs if a and b)


def compare(runs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, list[dict]]:
    """Paired ratios per row over rounds: ``runs`` holds each round's (earlier, later)
    results; throughput rows by ``name`` (``vs_sync`` later / earlier, and each tree's
    median steps/s), null rows by backend and workers (wall and CPU, later / earlier)."""
    rows: dict[str, list[tuple[dict, dict]]] = {}
    for a, b in runs:
        b_rows = {r["name"]: r for r in b["throughput"]}
        for row in a["throughput"]:
            if row["name"] in b_rows and row.get("vs_sync") is not None:
                rows.setdefault(row["name"], []).append((row, b_rows[row["name"]]))
    throughput = [
        {
            "name": name,
            "steps_per_s": [statistics.median(p[i]["steps_per_s"] for p in pairs) for i in (0, 1)],
            "vs_sync": [statistics.median(p[i]["vs_sync"] for p in pairs) for i in (0, 1)],
            "cpu_us": [
                _median(p[i].get("total_cpu_us_per_env_step") for p in pairs) for i in (0, 1)
            ],
            "steps_later_over_earlier": _median_ratio(
                [(p[0]["steps_per_s"], p[1]["steps_per_s"]) for p in pairs]
            ),
            "vs_sync_later_over_earlier": _median_ratio(
                [(p[0]["vs_sync"], p[1]["vs_sync"]) for p in pairs]
            ),
            "cpu_later_over_earlier": _median_ratio(
                [
                    (p[0].get("total_cpu_us_per_env_step"), p[1].get("total_cpu_us_per_env_step"))
                    for p in pairs
                ]
            ),
        }
        for name, pairs in rows.items()
    ]
    nulls: dict[tuple[str, int], list[tuple[dict, dict]]] = {}
    for a, b in runs:
        b_rows = {(r["backend"], r["workers"]): r for r in b["null_round_trip"]}
        for row in a["null_round_trip"]:
            key = (row["backend"], row["workers"])
            if key in b_rows:
                nulls.setdefault(key, []).append((row, b_rows[key]))

    def cpu(row: dict) -> float:
        return row["parent_cpu_us"] + row["worker_cpu_us"]

    null = [
        {
            "backend": backend,
            "workers": workers,
            "wall_us": [
                statistics.median(p[i]["us_per_worker_round_trip"] for p in pairs) for i in (0, 1)
            ],
            "cpu_us": [statistics.median(cpu(p[i]) for p in pairs) for i in (0, 1)],
            "wall_later_over_earlier": _median_ratio(
                [
                    (p[0]["us_per_worker_round_trip"], p[1]["us_per_worker_round_trip"])
                    for p in pairs
                ]
            ),
            "cpu_later_over_earlier": _median_ratio([(cpu(p[0]), cpu(p[1])) for p in pairs]),
        }
        for (backend, workers), pairs in nulls.items()
    ]
    return {"throughput": throughput, "null_round_trip": null}


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown(table: dict[str, list[dict]], labels: Sequence[str] = ("earlier", "later")) -> str:
    """The comparison as two markdown tables (throughput rows, then null-env rows), the
    trees' columns headed by ``labels``."""
    a, b = labels
    lines = [
        f"| row | env steps/s ({a}) | env steps/s ({b}) | later / earlier "
        f"| vs Sync ({a}) | vs Sync ({b}) | later / earlier "
        f"| CPU us per env step ({a}) | ({b}) | later / earlier |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in table["throughput"]:
        lines.append(
            f"| {r['name']} | {r['steps_per_s'][0]:.0f} | {r['steps_per_s'][1]:.0f} "
            f"| {_fmt(r['steps_later_over_earlier'], '.3f')} "
            f"| {r['vs_sync'][0]:.2f} | {r['vs_sync'][1]:.2f} "
            f"| {_fmt(r['vs_sync_later_over_earlier'], '.3f')} "
            f"| {_fmt(r['cpu_us'][0], '.1f')} | {_fmt(r['cpu_us'][1], '.1f')} "
            f"| {_fmt(r['cpu_later_over_earlier'], '.3f')} |"
        )
    lines += [
        "",
        f"| null env | workers | wall us ({a}) | wall us ({b}) | wall later / earlier "
        f"| CPU us ({a}) | CPU us ({b}) | CPU later / earlier |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in table["null_round_trip"]:
        lines.append(
            f"| {r['backend']} | {r['workers']} | {r['wall_us'][0]:.1f} | {r['wall_us'][1]:.1f} "
            f"| {_fmt(r['wall_later_over_earlier'], '.3f')} | {r['cpu_us'][0]:.1f} "
            f"| {r['cpu_us'][1]:.1f} | {_fmt(r['cpu_later_over_earlier'], '.3f')} |"
        )
    return "\n".join(lines)


def results_table(result: dict[str, Any]) -> str:
    """The tables of a written result (the whole JSON file) under a line naming its trees,
    their columns headed earlier and later (the docs render it from the file)."""
    earlier, later = result["trees"]
    return f"earlier: {earlier}, later: {later}\n\n" + markdown(result["comparison"])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the rounds, print and write the comparison."""
    args = tyro.cli(Args, args=argv)
    started, load_start = time.time(), os.getloadavg()[0]
    runs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            pair = []
            for i, tree in enumerate(args.trees):
                out = Path(scratch) / f"round{round_index}_tree{i}.json"
                pair.append(run_tree(tree, args.throughput_args, out))
                print(
                    f"round {round_index + 1}/{args.rounds}: {tree} done "
                    f"(load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
            runs.append((pair[0], pair[1]))
    report = {
        "run": run_record(REPO, started, load_start, ["gymnasium", "numpy", "torch"]),
        "trees": [str(t) for t in args.trees],
        "packages": [runs[0][0]["package"], runs[0][1]["package"]],
        "comparison": compare(runs),
        "runs": [list(pair) for pair in runs],
    }
    write_results(args.output, report, results_table(relative_paths(report)))
    return report


if __name__ == "__main__":
    main()
