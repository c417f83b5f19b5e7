"""The examples run as users would run them."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.timeout(180)
def test_quickstart_runs_and_finishes_episodes(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["quickstart.py"])
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    count = int(out.split(" episodes finished")[0].split()[-1])
    assert count > 0
    # what it shows, with the figures that prove it: the other stage stepped while the
    # policy inferred, the bubble, and what one stage would take
    overlap = re.search(r"another stage's envs were stepping (\d+)% of that time", out)
    assert overlap and int(overlap.group(1)) > 0, out
    assert re.search(r"sat idle \d+% of the time \(the bubble\)", out), out
    assert "one stage, with no overlap, would run at" in out and "bottleneck: " in out
