"""Draw the overview page's pipeline picture: serial rollout vs 2 stages, as a timeline.

    python scripts/draw_pipeline.py                 # writes docs/images/pipeline.svg

A schematic, not a measurement: per round the envs need ``Te`` of CPU time and the policy
``Ti`` of device time (here ``Te = 4``, ``Ti = 2``), split evenly over the stages. The
schedule is simulated, not drawn by hand: a stage's inference starts when its step has
finished and the device is free, its step when its inference has finished and the CPUs are
free. The serial loop then takes ``Te + Ti`` per round and the pipeline ``max(Te, Ti)``,
the bound the overview page and the benchmarks quote. The committed SVG is what the docs
show, so building the docs does not need matplotlib; rerun this after changing it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "images" / "pipeline.svg"
STAGE_COLORS = ("#4c72b0", "#dd8452")  # stage 0, stage 1
SERIAL_COLOR = "#8c8c8c"


@dataclass(frozen=True)
class Block:
    """One busy interval on a resource row ("device" or "cpus")."""

    row: str
    start: float
    end: float
    label: str
    stage: int | None  # None: the serial loop (all envs)


def serial_schedule(te: float, ti: float, horizon: float) -> list[Block]:
    """Infer for all envs, then step all envs, until ``horizon``."""
    blocks, t = [], 0.0
    while t + ti + te <= horizon:
        blocks.append(Block("device", t, t + ti, "infer all", None))
        blocks.append(Block("cpus", t + ti, t + ti + te, "step all envs", None))
        t += ti + te
    return blocks


def pipelined_schedule(te: float, ti: float, stages: int, horizon: float) -> list[Block]:
    """Each stage alternates infer (device) and step (CPUs); each resource runs one at a time.

    Stages are served in round-robin order, so the simulation is deterministic.
    """
    ti_s, te_s = ti / stages, te / stages
    device_free = cpus_free = 0.0
    ready = [0.0] * stages  # when each stage's last step finished
    blocks: list[Block] = []
    while True:
        s = min(range(stages), key=lambda k: (ready[k], k))
        infer_start = max(ready[s], device_free)
        step_start = max(infer_start + ti_s, cpus_free)
        if step_start + te_s > horizon:
            return blocks
        blocks.append(Block("device", infer_start, infer_start + ti_s, f"infer {s}", s))
        blocks.append(Block("cpus", step_start, step_start + te_s, f"step {s}", s))
        device_free, cpus_free = infer_start + ti_s, step_start + te_s
        ready[s] = step_start + te_s


def draw(path: Path, te: float = 4.0, ti: float = 2.0, horizon: float = 18.0) -> None:
    """Write the two-panel timeline to ``path`` (format from the suffix: .svg or .png)."""
    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "pipelined-vec-env"})
    panels = [
        (f"serial: a round takes Te + Ti = {te + ti:g}", serial_schedule(te, ti, horizon)),
        (
            f"2 stages: a round takes max(Te, Ti) = {max(te, ti):g}",
            pipelined_schedule(te, ti, 2, horizon),
        ),
    ]
    fig, axes = plt.subplots(2, 1, figsize=(10, 3.8), sharex=True)
    rows = {"device": 1, "cpus": 0}
    for ax, (title, blocks) in zip(axes, panels, strict=True):
        for b in blocks:
            color = SERIAL_COLOR if b.stage is None else STAGE_COLORS[b.stage]
            ax.broken_barh(
                [(b.start, b.end - b.start)],
                (rows[b.row] - 0.35, 0.7),
                facecolors=color,
                edgecolors="white",
                linewidth=1.5,
            )
            ax.text(
                (b.start + b.end) / 2, rows[b.row], b.label, ha="center", va="center",
                color="white", fontsize=7.5 if b.row == "device" else 9, fontweight="bold",
            )  # fmt: skip
        ax.set_yticks([0, 1], ["env workers\n(CPUs)", "policy\n(GPU)"], fontsize=10)
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(title, loc="left", fontsize=11)
        ax.set_facecolor("#f4f4f4")  # grey = idle
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(axis="y", length=0)
    axes[-1].set_xlim(0, horizon)
    axes[-1].set_xlabel(f"time (Te = {te:g}: env stepping per round, Ti = {ti:g}: inference)")
    fig.legend(
        handles=[
            Patch(facecolor=STAGE_COLORS[0], label="stage 0 (envs 0..N/2)"),
            Patch(facecolor=STAGE_COLORS[1], label="stage 1 (envs N/2..N)"),
            Patch(facecolor=SERIAL_COLOR, label="all envs"),
            Patch(facecolor="#f4f4f4", edgecolor="#cccccc", label="idle"),
        ],
        loc="lower center",
        ncol=4,
        fontsize=9,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="image path (.svg or .png)")
    args = parser.parse_args(argv)
    draw(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
