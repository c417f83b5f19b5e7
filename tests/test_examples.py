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
    # the bubble, split into the caller's waits for the envs and its own work
    bubble = re.search(
        r"sat idle (\d+)% of the time \(the bubble\): (\d+)% waiting in step_wait for a "
        r"stage's envs,\n  (\d+)% in the loop's own work",
        out,
    )
    assert bubble, out
    idle, waited, own = map(int, bubble.groups())
    assert 0 <= waited <= idle and own >= 0, out  # the waits are part of the bubble
    assert "one stage, with no overlap, would run at" in out and "bottleneck: " in out
    assert all(len(line) <= 100 for line in out.splitlines()), out  # short lines
