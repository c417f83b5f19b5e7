"""Smoke test: ``benchmarks/soak.py`` runs end to end with tiny numbers.

It checks the JSON's shape and that descriptor counts do not move over a short run; no
memory figure is asserted (a few thousand steps say nothing about a slope).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from .conftest import load_script

pytest.importorskip("tyro")
pytest.importorskip("psutil")

pytestmark = pytest.mark.timeout(120)


def _load_script() -> ModuleType:
    return load_script("benchmarks/soak.py", "benchmarks_soak")


def test_fit_slope_is_least_squares() -> None:
    soak = _load_script()
    x = np.arange(10) * 1000
    assert soak.fit_slope(x, 3.0 * x + 7) == pytest.approx(3.0)
    assert soak.fit_slope(x[:1], x[:1]) == 0.0


def test_soak_main_tiny(tmp_path: Path) -> None:
    soak = _load_script()
    output = tmp_path / "soak.json"
    result = soak.main(soak.Args(steps=2000, samples=5, num_envs=4, output=output))
    saved = json.loads(output.read_text())
    assert saved["env_steps"] == result["env_steps"] == 2000
    assert len(saved["samples"]) == 6
    fits = saved["fits"]
    assert set(fits) >= {
        "parent_rss",
        "children_rss",
        "total_rss",
        "parent_fds",
        "children_fds",
        "shm_maps",
    }
    assert fits["parent_fds"]["flat"] and fits["children_fds"]["flat"] and fits["shm_maps"]["flat"]
    assert all(s["children"] >= 2 for s in saved["samples"])  # the workers were counted
