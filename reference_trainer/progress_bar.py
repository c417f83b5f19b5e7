"""The trainer's progress bar: env steps, or seconds when a time budget ends the run.

With ``--deadline`` or ``--max-minutes`` the run ends on the clock, not at
``--total-timesteps``, so a bar of env steps would show a meaningless ETA and jump to
100% when time runs out. The bar then counts seconds of the budget instead (evaluations
included: they spend the same budget) and shows the env steps beside it.

While the bar is open, log lines to the console go through tqdm
(`tqdm.contrib.logging.logging_redirect_tqdm`): the bar is cleared, the line printed on
its own, the bar drawn again below it, instead of the line running on from the bar's.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

__all__ = ["TrainingBar"]


class TrainingBar:
    """A tqdm bar of env steps, or of budget seconds when ``budget_s`` is given.

    Args:
        total_steps: env steps the run would take without a time budget.
        initial_steps: env steps already done (a resumed run).
        budget_s: seconds the run has (None: a bar of env steps).
        desc: the bar's label.
        enabled: False: no output (``--no-progress``).
    """

    def __init__(
        self,
        total_steps: int,
        initial_steps: int,
        budget_s: float | None,
        desc: str,
        enabled: bool,
    ) -> None:
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._redirect = contextlib.ExitStack()
        if enabled:
            self._redirect.enter_context(logging_redirect_tqdm(tqdm_class=tqdm))
        self.by_time = budget_s is not None
        self._start = time.monotonic()
        self._steps = initial_steps
        self._postfix: dict[str, Any] = {}
        self._desc = desc
        self._budget_s = budget_s or 0.0
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
        """Label the bar with ``why`` training stopped early (the final evaluation still
        shows on it). A step bar ends full (the budget, not the step count, ended it); a
        time bar stays where the clock is: the rest of the budget is the final
        evaluation's."""
        self._desc = f"{self._desc.split(' (')[0]} ({why})"
        self._bar.set_description(self._desc, refresh=False)
        if self.by_time:
            self.tick()
        else:
            self._bar.total = self._bar.n
            self._bar.refresh()

    def close(self, label: str | None = None) -> None:
        """Close the bar, first labelled ``label`` if given (again is fine).

        tqdm draws a bar a last time as it closes it, so the label (and a time bar's
        clock) is set without a draw of its own: written to a file, where every draw
        stays, the closing line appears once. A time bar ends at the seconds the run
        took, out of its budget (or of the seconds taken, when they passed it)."""
        if label is not None and not self._bar.disable:
            self._bar.set_description(label, refresh=False)
            if self.by_time:
                # the run is over: the seconds it took of the seconds it had (a run that
                # stopped early for its final evaluation shows the budget it left unused)
                elapsed = time.monotonic() - self._start
                self._bar.n = round(elapsed)
                if elapsed >= self._budget_s:  # it ran to (or past) its budget: full
                    self._bar.total = self._bar.n = max(1, self._bar.n)
        self._bar.close()
        self._redirect.close()
