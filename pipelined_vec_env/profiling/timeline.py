"""The timeline picture of a profiler `Recording` (matplotlib, imported only here)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from .records import Recording, merged_waits, placed
from .summary import summarize

__all__ = ["draw_timeline"]

# what each row was doing -> colour
_COLOURS = {
    "step": "#1f77b4",
    "reset": "#ff7f0e",
    "start": "#8c564b",
    "call": "#7f7f7f",
    "set_attr": "#7f7f7f",
    "in flight": "#c6dbef",
    "inference": "#2ca02c",
    "wait": "#d62728",
    "span": "#9467bd",
}
_WINDOW_COMMANDS = 24


def draw_timeline(
    recording: Recording, path: Path, start_s: float | None, duration_s: float | None
) -> Path:
    """Draw `recording` into the PNG `path` (see `Profiler.plot` for the arguments)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - matplotlib is in the train extra
        raise ImportError("Profiler.plot needs matplotlib: pip install matplotlib") from exc

    workers, threads = recording.workers, recording.threads
    times = [r[2] for r in recording.commands] + [s[3] for s in recording.spans]
    times += [w[2] for w in recording.waits] + [s[2] for s in recording.stage_spans]
    ends = [r[5] for r in recording.commands] + [s[4] for s in recording.spans]
    ends += [w[3] for w in recording.waits] + [s[3] for s in recording.stage_spans]
    origin = min(times, default=0)
    last = max(ends, default=origin)
    if duration_s is None:
        duration_s = _default_window(recording.commands, origin, last)
    if start_s is None:
        start_s = max(0.0, (last - origin) / 1e9 - duration_s)
    lo, hi = start_s, start_s + duration_s

    def to_ms(t: int) -> float:
        return (t - origin) / 1e6

    rows: list[str] = []
    bars: dict[int, list[tuple[float, float, str]]] = {}
    thread_rows = {}
    for track in sorted(threads) or [0]:
        thread_rows[track] = len(rows)
        name = threads.get(track, "caller")
        rows.append("caller" if track == 0 else f"caller: {name}")
    stage_rows = {}
    for s in range(max(recording.num_stages, 1)):
        stage_rows[s] = len(rows)
        rows.append(f"stage {s}")
    worker_rows = {}
    for w, (s, _envs) in sorted(workers.items()):
        worker_rows[w] = len(rows)
        rows.append(f"worker {w} (stage {s})")

    def add(row: int, t0: int, t1: int, what: str) -> None:
        a, b = to_ms(t0), to_ms(t1)
        if b < lo * 1e3 or a > hi * 1e3:
            return
        bars.setdefault(row, []).append((a, max(b - a, 1e-3), what))

    for name, _stage, track, t0, t1 in recording.spans:
        add(thread_rows.get(track, 0), t0, t1, "inference" if name == "inference" else "span")
    for _name, _stages, t0, t1 in merged_waits(recording.waits):
        add(thread_rows.get(0, 0), t0, t1, "wait")
    for stage, op, t0, t1 in recording.stage_spans:
        add(stage_rows[stage], t0, t1, "in flight" if op == "step" else op)
    for worker, command, t_sent, t_start, t_end, t_recv, _kind in recording.commands:
        if worker not in worker_rows:
            continue
        add(worker_rows[worker], t_sent, t_recv, "in flight")
        start, dur = placed(t_sent, t_start, t_end, t_recv)
        add(worker_rows[worker], start, start + dur, command)

    height = 1.6 + 0.42 * len(rows)
    fig, ax = plt.subplots(figsize=(12, height))
    for row, items in bars.items():
        by_colour: dict[str, list[tuple[float, float]]] = {}
        for a, width, what in items:
            by_colour.setdefault(what, []).append((a, width))
        for what, spans in by_colour.items():
            bar_h = 0.8 if what != "in flight" else 0.5
            ax.broken_barh(
                spans,
                (row - bar_h / 2, bar_h),
                facecolors=_COLOURS.get(what, "#bcbd22"),
                edgecolors="white",  # adjacent calls in flight stay apart
                linewidth=0.4 if what == "in flight" else 0,
            )
    for name, worker, t, _args in recording.instants:
        x = to_ms(t)
        if worker in worker_rows and lo * 1e3 <= x <= hi * 1e3:
            ax.plot([x, x], [worker_rows[worker] - 0.5, worker_rows[worker] + 0.5], color="black")
            ax.annotate(name, (x, worker_rows[worker] + 0.45), fontsize=7)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(lo * 1e3, hi * 1e3)
    ax.set_xlabel("time since the first event (ms)")
    used = {what for items in bars.values() for *_, what in items}
    labels = {
        "step": "worker: step",
        "reset": "worker: reset",
        "start": "worker: start-up",
        "call": "worker: call",
        "set_attr": "worker: set_attr",
        "in flight": "command / stage call in flight",
        "inference": "caller: inference span",
        "wait": "caller: waiting for envs",
        "span": "caller: other span",
    }
    handles = [Patch(color=_COLOURS[k], label=labels[k]) for k in labels if k in used]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.9 / height),
        ncol=min(5, max(1, len(handles))),
        fontsize=8,
        frameon=False,
    )
    try:
        reason = summarize(recording)["bottleneck_reason"]
        ax.set_title("\n".join(textwrap.wrap(reason, 150)), fontsize=8, loc="left")
    except Exception:  # a picture without a title is still a picture
        pass
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _default_window(commands: Sequence[tuple], origin: int, last: int) -> float:
    """Seconds covering the last ``_WINDOW_COMMANDS`` commands of the busiest worker."""
    by_worker: dict[int, list[int]] = {}
    for r in commands:
        by_worker.setdefault(r[0], []).append(r[2])
    total = max((last - origin) / 1e9, 1e-6)
    if not by_worker:
        return total
    sent = max(by_worker.values(), key=len)
    if len(sent) <= _WINDOW_COMMANDS:
        return total
    sent.sort()
    return min(total, (last - sent[-_WINDOW_COMMANDS]) / 1e9)
