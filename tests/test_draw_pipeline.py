"""``scripts/draw_pipeline.py``: the overview picture's simulated schedule is the one the text states.

The overview page says a serial round costs ``Te + Ti`` and a pipelined one ``max(Te, Ti)``;
the picture is drawn from a simulated schedule, checked here, not from hand-placed boxes.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import load_script

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]


def _load_script() -> ModuleType:
    return load_script("scripts/draw_pipeline.py", "draw_pipeline")


draw_pipeline = _load_script()


def _round_ends(blocks, stages):
    """Times at which every stage has finished one more env step."""
    ends = sorted(b.end for b in blocks if b.row == "cpus")
    return ends[stages - 1 :: stages]


def _no_overlap(blocks, row):
    spans = sorted((b.start, b.end) for b in blocks if b.row == row)
    return all(a_end <= b_start for (_, a_end), (b_start, _) in pairwise(spans))


@pytest.mark.parametrize(("te", "ti"), [(4.0, 2.0), (2.0, 4.0), (3.0, 3.0)])
def test_rounds_take_te_plus_ti_serially_and_max_with_two_stages(te, ti):
    serial = draw_pipeline.serial_schedule(te, ti, horizon=60)
    ends = _round_ends(serial, 1)
    assert [b - a for a, b in pairwise(ends)] == [te + ti] * (len(ends) - 1)

    piped = draw_pipeline.pipelined_schedule(te, ti, stages=2, horizon=60)
    assert _no_overlap(piped, "device") and _no_overlap(piped, "cpus")
    for s in (0, 1):  # a stage steps only after its inference, infers only after its step
        mine = sorted((b for b in piped if b.stage == s), key=lambda b: (b.start, b.row))
        assert all(a.end <= b.start for a, b in pairwise(mine))
    steady = _round_ends(piped, 2)[2:]  # past the warm-up
    assert [b - a for a, b in pairwise(steady)] == [max(te, ti)] * (len(steady) - 1)


def test_draw_writes_the_image(tmp_path):
    out = tmp_path / "pipeline.svg"
    draw_pipeline.draw(out)
    text = out.read_text()
    assert text.startswith("<?xml") and "infer 0" in text and "step all envs" in text


def test_committed_image_exists():
    assert (ROOT / "docs" / "images" / "pipeline.svg").stat().st_size > 1000
