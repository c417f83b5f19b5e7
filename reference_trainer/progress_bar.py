"""The trainer's progress bar: env steps, or seconds when a time budget ends the run.

With ``--deadline`` or ``--max-minutes`` the run ends on the clock, not at
``--total-timesteps``, so a bar of env steps would show a meaningless ETA and jump to
100% when time runs out. The bar then counts seconds of the budget instead (evaluations
included: they spend the same budget) and shows the env steps beside it. A script can
open one bar for a whole job (``started``: the job's start) and hand it to `train`
(`start_training`); whoever opened it closes it, full.

While the bar is open, log lines to the console go through tqdm
(`tqdm.contrib.logging.logging_redirect_tqdm`): the bar is cleared, the line printed on
its own, the bar drawn again below it, instead of the line running on from the bar's.
A daemon thread redraws it every `TICK_S` seconds, so that a time bar moves while a step
reports nothing (the demos, BC, an episode); `close` stops and joins it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

__all__ = ["TICK_S", "TrainingBar"]

TICK_S = 1.0
"""Seconds between the bar's own redraws (a time bar moves to the seconds elapsed)."""


class TrainingBar:
    """A tqdm bar of env steps, or of budget seconds when ``budget_s`` is given.

    Args:
        total_steps: env steps the run would take without a time budget.
        initial_steps: env steps already done (a resumed run).
        budget_s: seconds the run has (None: a bar of env steps).
        desc: the bar's label.
        enabled: False: no output (``--no-progress``) and no redraw thread.
        started: when the budget began (seconds since the epoch; None: now): a time bar
            counts from there.
        tick_s: seconds between the bar's own redraws (`TICK_S`).
    """

    def __init__(
        self,
        total_steps: int | None,
        initial_steps: int,
        budget_s: float | None,
        desc: str,
        enabled: bool,
        started: float | None = None,
        tick_s: float = TICK_S,
    ) -> None:
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._redirect = contextlib.ExitStack()
        if enabled:
            self._redirect.enter_context(logging_redirect_tqdm(tqdm_class=tqdm))
        self.by_time = budget_s is not None
        self._start = time.monotonic() - (0.0 if started is None else time.time() - started)
        self._steps = initial_steps
        self._postfix: dict[str, Any] = {}
        self._desc = desc
        self._budget_s = budget_s or 0.0
        self.ended: str | None = None
        """Why training stopped early (`end`), or None."""
        if self.by_time:
            assert budget_s is not None
            self._bar = tqdm(
                total=max(1, round(budget_s)),
                unit="s",
                desc=f"{desc}: ",  # as set_description writes later labels
                disable=not enabled,
                dynamic_ncols=True,
                bar_format="{desc}{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} s{postfix}",
            )
        else:
            self._bar = tqdm(
                total=total_steps,
                initial=initial_steps,
                unit="step",
                desc=desc,
                disable=not enabled,
                dynamic_ncols=True,
            )
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if enabled:
            self._ticker = threading.Thread(
                target=self._tick_until_closed, args=(tick_s,), name="progress-bar", daemon=True
            )
            self._ticker.start()

    def _tick_until_closed(self, tick_s: float) -> None:
        """The redraw thread: `tick` every ``tick_s`` seconds until `close`."""
        while not self._stop.wait(tick_s):
            if self.by_time:
                self.tick()
            else:
                self._bar.refresh()  # the elapsed time and rate

    def start_training(self, desc: str, total_steps: int, initial_steps: int) -> None:
        """Training begins on a bar opened before it: label it ``desc``; a bar of env steps
        counts from ``initial_steps`` to ``total_steps``."""
        self._desc = desc
        self._steps = initial_steps
        if not self.by_time:
            self._bar.reset(total=total_steps)
            self._bar.update(initial_steps)
        self.describe(desc)

    @property
    def label(self) -> str:
        """The training label (restored after an evaluation; `end` changes it)."""
        return self._desc

    def describe(self, text: str) -> None:
        """Show ``text`` as the bar's label (and move a time bar to now)."""
        self._bar.set_description(text, refresh=not self.by_time)
        self.tick()

    def tick(self) -> None:
        """Move a time bar to the seconds elapsed (a step bar does not move)."""
        if self.by_time:
            self._to_now()
            self._bar.refresh()

    def _to_now(self) -> None:
        self._bar.n = min(self._bar.total, round(time.monotonic() - self._start))

    def advance(self, env_steps: int, postfix: dict[str, Any]) -> None:
        """Count ``env_steps`` more and show ``postfix`` (a time bar adds the step count)."""
        self._steps += env_steps
        if self.by_time:
            self._bar.set_postfix({"steps": f"{self._steps:,}", **postfix}, refresh=False)
            self.tick()
        else:
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(env_steps)

    def episodes(self, done: int, total: int) -> None:
        """Show an evaluation's progress, ``done`` of ``total`` episodes, after the label
        (the bar itself keeps counting env steps or budget seconds)."""
        self._bar.set_postfix_str(f"{done}/{total} evaluation episodes", refresh=False)
        if self.by_time:
            self.tick()
        else:
            self._bar.refresh()

    def end(self, why: str) -> None:
        """Training stopped early because ``why`` (kept in `ended` for the next label;
        nothing drawn: the log says it). A step bar ends full: the budget, not the step
        count, ended it."""
        self.ended = why
        if not self.by_time:
            self._bar.total = self._bar.n

    def close(self, label: str | None = None) -> None:
        """Close the bar, first labelled ``label`` if given (again is fine).

        With ``label`` the run is done and the bar ends full: a time bar at the seconds
        the run took (out of themselves: a run that kept time for its final evaluation
        ends before its budget) with the env steps done beside them, a step bar at the
        steps done. tqdm draws a bar a last
        time as it closes it, so the label and the count are set without a draw of their
        own: written to a file, where every draw stays, the closing line appears once.
        The redraw thread is stopped and joined first (a redraw takes milliseconds; the
        join waits 5 s at most)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5.0)
        if label is not None and not self._bar.disable:
            self._bar.set_description(label, refresh=False)
            if self.by_time:
                self._bar.total = self._bar.n = max(1, round(time.monotonic() - self._start))
                self._bar.set_postfix({"steps": f"{self._steps:,}"}, refresh=False)
            elif self._bar.total is None or self._bar.n < self._bar.total:
                self._bar.total = max(1, self._bar.n)
        self._bar.close()
        self._redirect.close()
