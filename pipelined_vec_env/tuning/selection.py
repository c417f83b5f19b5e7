"""Which verified layout `tune` returns, from short runs on a machine whose load drifts.

`tune` runs each layout it verifies in rounds (every layout once per round, every other
round in reverse order), the same env steps per run. On a shared machine a run's rate
varies with the load of its moment, by as much as layouts differ; these functions decide,
from each layout's per-round rates alone (no clock, no processes: unit-tested with made-up
rates), which layouts stay in the race and which one wins:

- a layout's *rate* is the median of its per-round rates: one run caught by a burst of
  other work does not decide it (the pooled rate, all steps over all time, is a harmonic
  mean that one slow run pulls down; the median of three ignores it);
- two layouts are *separated* when their per-round ranges (lowest to highest rate) do not
  overlap: then every run of one was faster than every run of the other; otherwise the
  measurements cannot tell them apart;
- among the layouts not separated from the best, the simpler one wins (``prefer``; in
  `tune`, the workers at the caller's priority over niced ones), then the higher rate.

The idea of racing candidates, dropping those measured clearly worse and spending the
remaining runs on the close ones, is that of F-Race (Birattari et al., "A Racing Algorithm
for Configuring Metaheuristics", GECCO 2002) and successive halving, without their
statistical tests: with 2-3 runs a layout, the range is all there is to go on.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

__all__ = ["choose", "rate", "runoff", "separated", "survivors"]

K = TypeVar("K", bound=Hashable)


def rate(rounds: Sequence[float]) -> float:
    """A layout's rate: the median of its per-round rates (env steps/s).

    Raises:
        ValueError: No rounds.
    """
    if not rounds:
        raise ValueError("rounds: expected at least one per-round rate, got none")
    return float(np.median(rounds))


def separated(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two layouts' per-round rates do not overlap (every run of one was faster).

    A layout with one run has a range of one point, so two single runs are separated
    unless equal: with nothing measured about the noise, the measurements are taken as
    they are.
    """
    return min(a) > max(b) or min(b) > max(a)


def _ranked(rates: Mapping[K, Sequence[float]]) -> list[K]:
    return sorted(rates, key=lambda k: rate(rates[k]), reverse=True)


def survivors(rates: Mapping[K, Sequence[float]], tolerance: float) -> list[K]:
    """Layouts that stay in the race after the first round: those measured within
    ``tolerance`` (a fraction) of the best rate, best first.

    In `tune` the tolerance is ``verify_close``, the gap the model cannot rank: a layout
    measured further below the best in its first run than the model's own error is not
    run again.

    Raises:
        ValueError: No layouts, or a tolerance outside [0, 1).
    """
    if not rates:
        raise ValueError("rates: expected at least one layout's rounds, got none")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance: expected a fraction in [0, 1), got {tolerance!r}")
    ranked = _ranked(rates)
    best = rate(rates[ranked[0]])
    return [k for k in ranked if rate(rates[k]) >= (1 - tolerance) * best]


def runoff(rates: Mapping[K, Sequence[float]], size: int = 2) -> list[K]:
    """The layouts worth one more round: the best and the best-rated ones not separated
    from it, at most ``size`` in all; empty when the best is separated from all others
    (more runs would not change the choice).

    Raises:
        ValueError: No layouts, or ``size`` < 2.
    """
    if not rates:
        raise ValueError("rates: expected at least one layout's rounds, got none")
    if size < 2:
        raise ValueError(f"size: expected an int >= 2, got {size!r}")
    best, *rest = _ranked(rates)
    close = [k for k in rest if not separated(rates[best], rates[k])]
    return [best, *close[: size - 1]] if close else []


def choose(
    rates: Mapping[K, Sequence[float]],
    prefer: Callable[[K], Any] = lambda k: 0,
) -> K:
    """The winner: among the layouts not separated from the best rated, the one with the
    lowest ``prefer`` key, then the highest rate.

    Args:
        rates: Each layout's per-round env steps/s.
        prefer: Key of simplicity, lower preferred (in `tune`: 0 for workers at the
            caller's priority, 1 for niced or idle ones).

    Returns:
        One of the keys of ``rates``.

    Raises:
        ValueError: No layouts.

    Examples:
        >>> choose({"a": [300.0, 150.0, 310.0], "b": [280.0, 285.0, 290.0]})
        'a'
        >>> niced = lambda name: name.endswith("nice 10")
        >>> choose({"b=1 nice 10": [330.0, 300.0], "b=1": [310.0, 320.0]}, prefer=niced)
        'b=1'
    """
    if not rates:
        raise ValueError("rates: expected at least one layout's rounds, got none")
    ranked = _ranked(rates)
    best = ranked[0]
    tied = [k for k in ranked if k == best or not separated(rates[best], rates[k])]
    return min(tied, key=lambda k: (prefer(k), -rate(rates[k])))
