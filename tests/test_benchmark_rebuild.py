"""benchmarks/rebuild.py runs end to end on a tiny setting (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script

pytestmark = pytest.mark.timeout(300)


def test_rebuild_benchmark_main_tiny(tmp_path: Path) -> None:
    rebuild = load_script("benchmarks/rebuild.py", "benchmarks_rebuild")
    out = tmp_path / "rebuild.json"
    result = rebuild.main(
        [
            "--num-workers", "2",
            "--failed", "1", "2",
            "--build-seconds", "0.05",
            "--rounds", "1",
            "--output", str(out),
        ]
    )  # fmt: skip
    saved = json.loads(out.read_text())
    assert [row["failed"] for row in saved["rows"]] == [1, 2]
    assert all(row["this_s"] > 0 for row in result["rows"])
    assert out.with_suffix(".md").read_text().startswith("2 workers of one env")
