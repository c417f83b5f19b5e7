"""How long a step takes that rebuilds several failed workers at once.

``num_workers`` workers of one env each, with one restart allowed per measurement
(``max_restarts=len(failed)``: worker 0 fails in every one); the env's constructor sleeps
``build_seconds`` (a LIBERO env takes seconds to build). One step kills ``k`` of
the workers (the env SIGKILLs its own process, `debug_envs.FaultyEnv`'s action 3), so
that step returns only once they are rebuilt: fresh processes, envs built, reset. Timed
per ``k`` in ``--failed``. The workers of one call restart together
(`WorkerPool.rebuild`); one after another, the step would take about ``k`` times
longer.

Each variant runs in its own child process (``--baseline PATH`` puts another checkout's
``pipelined_vec_env`` first on ``PYTHONPATH`` for the ``baseline`` variant), and rounds
visit every variant in turn. The figure per variant and ``k`` is the median over the
rounds, beside the bound: one construction (``build_seconds``), since every failed
worker can build its env at once.

Run::

    python benchmarks/rebuild.py
    mkdir -p /tmp/old && git archive <commit> pipelined_vec_env | tar -x -C /tmp/old
    python benchmarks/rebuild.py --baseline /tmp/old

Results go to ``benchmarks/results/rebuild.json``, with a Markdown table beside it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _children import run_child_json  # noqa: E402
from _machine import cpu_model, machine_identity, package_versions, relative_paths  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "rebuild.json"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Args:
    """Rebuild benchmark options."""

    num_workers: int = 4
    """Workers (one env each)."""
    failed: tuple[int, ...] = (1, 2, 4)
    """How many workers fail in the timed step, one measurement each."""
    build_seconds: float = 1.0
    """Seconds each env's constructor sleeps."""
    rounds: int = 3
    """Rounds; each runs every variant once."""
    baseline: str | None = None
    """Another checkout (its directory holding ``pipelined_vec_env``): adds the
    ``baseline`` variant."""
    output: Path = RESULTS
    """JSON results file (a ``.md`` table is written beside it)."""
    child: str | None = None
    """Internal: run one variant and print its timings."""


def slow_build(build_seconds: float) -> object:
    """A `debug_envs.FaultyEnv`, built after sleeping ``build_seconds``."""
    from pipelined_vec_env.debug_envs import FaultyEnv

    time.sleep(build_seconds)
    return FaultyEnv()


def run_child(args: Args) -> dict[str, object]:
    """Time the rebuilding step for each ``k`` in ``args.failed`` (see the module doc)."""
    import functools

    import numpy as np

    import pipelined_vec_env
    from pipelined_vec_env import PipelinedVectorEnv
    from pipelined_vec_env.debug_envs import FaultyEnv

    fn = functools.partial(slow_build, args.build_seconds)
    seconds: dict[str, float] = {}
    envs = PipelinedVectorEnv(
        [fn] * args.num_workers, envs_per_worker=1, max_restarts=len(args.failed)
    )
    try:
        envs.reset(seed=0)
        for k in args.failed:
            actions = np.zeros(args.num_workers, dtype=np.int64)
            actions[:k] = FaultyEnv.SIGKILL
            t0 = time.perf_counter()
            _, _, _, truncated, _ = envs.step(actions)
            seconds[str(k)] = time.perf_counter() - t0
            assert truncated[:k].all() and not truncated[k:].any(), truncated
            envs.step(np.zeros_like(actions))  # the rebuilt envs' autoreset step
    finally:
        envs.close()
    return {"seconds": seconds, "package": str(Path(pipelined_vec_env.__file__).parent)}


def summarise(args: Args, runs: dict[str, list[dict]]) -> list[dict[str, object]]:
    """One row per ``k``: each variant's median seconds over the rounds, and the bound."""
    rows = []
    for k in args.failed:
        row: dict[str, object] = {"failed": k, "bound_s": args.build_seconds}
        for variant, results in runs.items():
            row[f"{variant}_s"] = statistics.median(r["seconds"][str(k)] for r in results)
        rows.append(row)
    return rows


def table(args: Args, rows: list[dict[str, object]], variants: list[str]) -> str:
    """The rows as a Markdown table."""
    head = "| failed workers | " + " | ".join(f"{v} (s)" for v in variants) + " | bound (s) |"
    lines = [
        f"{args.num_workers} workers of one env, each env built in {args.build_seconds:g} s; "
        f"the step that rebuilds the failed workers, median of {args.rounds} rounds.",
        "",
        head,
        "|---:|" + "---:|" * (len(variants) + 1),
    ]
    for row in rows:
        cells = " | ".join(f"{row[f'{v}_s']:.2f}" for v in variants)
        lines.append(f"| {row['failed']} | {cells} | {row['bound_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; print a table and write the JSON and Markdown results."""
    args = tyro.cli(Args, args=argv)
    if args.child is not None:
        print(json.dumps(run_child(args)))
        return {}
    variants = ["this"] + (["baseline"] if args.baseline else [])
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    load_start = os.getloadavg()
    for r in range(args.rounds):
        for v in variants:
            argv = ["--child", v, "--num-workers", str(args.num_workers)]
            argv += ["--build-seconds", str(args.build_seconds), "--failed", *map(str, args.failed)]
            path = args.baseline if v == "baseline" else str(REPO)
            runs[v].append(run_child_json(__file__, argv, path))
            print(f"round {r}: {v:8s} {runs[v][-1]['seconds']}", flush=True)
    rows = summarise(args, runs)
    result = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(args).items()},
        "machine": {
            **machine_identity(),
            "cpu_model": cpu_model(),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "python": platform.python_version(),
            "packages": package_versions(["gymnasium", "numpy"]),
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
        },
        "rows": rows,
        "runs": runs,
    }
    markdown = table(args, rows, variants)
    print(markdown)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(relative_paths(result), indent=2))
    args.output.with_suffix(".md").write_text(markdown + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
