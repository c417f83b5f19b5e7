"""``--profile``: record the rollouts with the vector env's profiler and write the report."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["recording", "write_profile"]


@contextlib.contextmanager
def recording(profiler: Any | None) -> Iterator[None]:
    """Keep the profiler's events inside the block only (None: do nothing)."""
    if profiler is None:
        yield
        return
    profiler.resume()
    try:
        yield
    finally:
        profiler.pause()


def write_profile(profiler: Any, run_dir: Path) -> dict[str, Any]:
    """Write ``trace.json`` (Chrome trace), ``timeline.png`` and ``profile.json`` (the
    summary) into ``run_dir``; return the summary."""
    summary = profiler.summary()
    profiler.export_chrome_trace(run_dir / "trace.json")
    profiler.plot(run_dir / "timeline.png")
    (run_dir / "profile.json").write_text(json.dumps(summary, indent=2))
    return summary
