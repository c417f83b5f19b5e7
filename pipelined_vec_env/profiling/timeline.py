"""The timeline picture of a profiler `Recording` (matplotlib, imported only here)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


# what each colour stands for in the legend, in its order
_LABELS = {
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

# per row: bars (start ms, width ms, what)
_Bars = dict[int, list[tuple[float, float, str]]]


@dataclass
class _Rows:
    """The picture's rows, top to bottom: the caller's threads, the stages, the workers."""

    names: list[str] = field(default_factory=list)
    threads: dict[int, int] = field(default_factory=dict)  # thread track -> row
    stages: dict[int, int] = field(default_factory=dict)  # stage -> row
    workers: dict[int, int] = field(default_factory=dict)  # worker -> row


@dataclass
class _Window:
    """The time shown: ``origin`` (ns) is the first event, ``lo``/``hi`` seconds after it."""

    origin: int
    lo: float
    hi: float

    def to_ms(self, t: int) -> float:
        return (t - self.origin) / 1e6

    def shows(self, a_ms: float, b_ms: float) -> bool:
        return not (b_ms < self.lo * 1e3 or a_ms > self.hi * 1e3)


def draw_timeline(
    recording: Recording, path: Path, start_s: float | None, duration_s: float | None
) -> Path:
    """Draw `recording` into the PNG `path` (see `Profiler.plot` for the arguments)."""
    plt, patch = _pyplot()
    window = _window(recording, start_s, duration_s)
    rows = _rows(recording)
    bars = _bars(recording, window, rows)
    height = 1.6 + 0.42 * len(rows.names)
    fig, ax = plt.subplots(figsize=(12, height))
    _draw_bars(ax, bars)
    _draw_instants(ax, recording, window, rows)
    ax.set_yticks(range(len(rows.names)), rows.names)
    ax.set_ylim(len(rows.names) - 0.5, -0.5)
    ax.set_xlim(window.lo * 1e3, window.hi * 1e3)
    ax.set_xlabel("time since the first event (ms)")
    _draw_legend(ax, patch, bars, height)
    _draw_title(ax, recording)
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _pyplot() -> tuple[Any, Any]:
    """matplotlib's ``pyplot`` (on the Agg backend unless one was chosen) and ``Patch``."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - matplotlib is in the train extra
        raise ImportError("Profiler.plot needs matplotlib: pip install matplotlib") from exc
    return plt, Patch


def _window(recording: Recording, start_s: float | None, duration_s: float | None) -> _Window:
    """The time shown: by default the last ``_WINDOW_COMMANDS`` commands of the busiest
    worker, ending at the last event."""
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
    return _Window(origin, start_s, start_s + duration_s)


def _rows(recording: Recording) -> _Rows:
    """One row per caller thread, per stage and per worker."""
    rows = _Rows()
    for track in sorted(recording.threads) or [0]:
        rows.threads[track] = len(rows.names)
        name = recording.threads.get(track, "caller")
        rows.names.append("caller" if track == 0 else f"caller: {name}")
    for s in range(max(recording.num_stages, 1)):
        rows.stages[s] = len(rows.names)
        rows.names.append(f"stage {s}")
    for w, (s, _envs) in sorted(recording.workers.items()):
        rows.workers[w] = len(rows.names)
        rows.names.append(f"worker {w} (stage {s})")
    return rows


def _bars(recording: Recording, window: _Window, rows: _Rows) -> _Bars:
    """The bars inside ``window``: the caller's spans and waits, the stages' calls in
    flight, each worker's commands in flight and the work they took in the worker."""
    bars: _Bars = {}

    def add(row: int, t0: int, t1: int, what: str) -> None:
        a, b = window.to_ms(t0), window.to_ms(t1)
        if window.shows(a, b):
            bars.setdefault(row, []).append((a, max(b - a, 1e-3), what))

    for name, _stage, track, t0, t1 in recording.spans:
        add(rows.threads.get(track, 0), t0, t1, "inference" if name == "inference" else "span")
    for _name, _stages, t0, t1 in merged_waits(recording.waits):
        add(rows.threads.get(0, 0), t0, t1, "wait")
    for stage, op, t0, t1 in recording.stage_spans:
        add(rows.stages[stage], t0, t1, "in flight" if op == "step" else op)
    for worker, command, t_sent, t_start, t_end, t_recv, _kind in recording.commands:
        if worker not in rows.workers:
            continue
        add(rows.workers[worker], t_sent, t_recv, "in flight")
        start, dur = placed(t_sent, t_start, t_end, t_recv)
        add(rows.workers[worker], start, start + dur, command)
    return bars


def _draw_bars(ax: Any, bars: _Bars) -> None:
    """Each row's bars, one ``broken_barh`` per colour (calls in flight thinner)."""
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


def _draw_instants(ax: Any, recording: Recording, window: _Window, rows: _Rows) -> None:
    """Restarts, deadline kills and deaths: a named tick on their worker's row."""
    for name, worker, t, _args in recording.instants:
        x = window.to_ms(t)
        if worker in rows.workers and window.lo * 1e3 <= x <= window.hi * 1e3:
            row = rows.workers[worker]
            ax.plot([x, x], [row - 0.5, row + 0.5], color="black")
            ax.annotate(name, (x, row + 0.45), fontsize=7)


def _draw_legend(ax: Any, patch: Any, bars: _Bars, height: float) -> None:
    """A legend of the colours drawn, below the axes."""
    used = {what for items in bars.values() for *_, what in items}
    handles = [patch(color=_COLOURS[k], label=_LABELS[k]) for k in _LABELS if k in used]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.9 / height),
        ncol=min(5, max(1, len(handles))),
        fontsize=8,
        frameon=False,
    )


def _draw_title(ax: Any, recording: Recording) -> None:
    """The summary's bottleneck reason as the title (none if the summary fails)."""
    try:
        reason = summarize(recording)["bottleneck_reason"]
        ax.set_title("\n".join(textwrap.wrap(reason, 150)), fontsize=8, loc="left")
    except Exception:  # a picture without a title is still a picture
        pass


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
