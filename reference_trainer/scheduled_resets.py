"""`ScheduledResets`: an env wrapper whose resets follow a list given once.

The trainer wraps every training env in it (`reference_trainer.envs.make_vector_env`) so
that evaluations run on the training envs from fixed initial states, across the vector
env's autoresets (see `reference_trainer.vector_eval`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

__all__ = ["PARK_KEY", "SCHEDULE_KEY", "ScheduledResets", "ScheduledResetsFn"]

SCHEDULE_KEY = "reset_schedule"
"""Reset option holding a list of ``(seed, options)`` for this and the following resets."""

PARK_KEY = "reset_schedule_park"
"""Reset option (bool, beside `SCHEDULE_KEY`): once the schedule is used up, park the env
instead of resetting it, until `ScheduledResets.extend_schedule` or an explicit reset."""

Schedule = Sequence[tuple[int | None, dict[str, Any] | None]]


def _checked(schedule: Any, allow_empty: bool) -> list[tuple[int | None, dict[str, Any] | None]]:
    if not isinstance(schedule, Sequence) or not (schedule or allow_empty):
        raise TypeError(
            f"options[{SCHEDULE_KEY!r}]: expected a{'' if allow_empty else ' non-empty'} list "
            f"of (seed, options), got {schedule!r}"
        )
    return [(s, None if o is None else dict(o)) for s, o in schedule]


class ScheduledResets(gym.Wrapper):
    """Follow a list of ``(seed, options)`` resets, given once, across autoresets.

    ``reset(options={"reset_schedule": [(s0, o0), (s1, o1), ...]})`` resets with
    ``(s0, o0)`` and the next resets without arguments (a vector env's autoresets) with
    ``(s1, o1)``, ... in turn; once the list is used up, or on any reset with explicit
    arguments, resets pass through unchanged.

    With ``"reset_schedule_park": True`` beside it (the list may then be empty) the env
    parks once the list is used up: that reset returns the observation and info of the
    env's last real reset without resetting it, and each step returns them again, reward
    0, not terminated, not truncated, without stepping the env, so an env with nothing
    left to play costs next to nothing. `extend_schedule` appends resets; a parked env's
    next step then returns truncated (one 0-reward step ends the parked stretch) and the
    autoreset starts the first of them. An explicit reset ends parking.

    Args:
        env: the env to wrap.

    Raises:
        TypeError: (at reset) if the schedule is not a sequence of pairs (non-empty
            without parking).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._pending: list[tuple[int | None, dict[str, Any] | None]] = []
        self._park = False
        self._parked = False
        self._last_reset: tuple[Any, dict[str, Any]] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Reset by the schedule (see the class docstring)."""
        self._parked = False
        if options is not None and SCHEDULE_KEY in options:
            options = dict(options)
            self._park = bool(options.pop(PARK_KEY, False))
            self._pending = _checked(options.pop(SCHEDULE_KEY), allow_empty=self._park)
            if self._pending:
                seed, options = self._pending.pop(0)
            else:  # nothing to play: one real reset for an observation, then parked
                seed, options, self._parked = None, None, True
        elif seed is None and options is None and self._pending:
            seed, options = self._pending.pop(0)
        elif seed is None and options is None and self._park and self._last_reset is not None:
            self._parked = True
            obs, info = self._last_reset
            return obs, dict(info)
        else:
            self._pending, self._park = [], False
        obs, info = self.env.reset(seed=seed, options=options)
        self._last_reset = (obs, dict(info))
        return obs, info

    def step(self, action: Any) -> Any:
        """Step the env, or, parked, return the last reset's observation again (truncated
        once resets were appended by `extend_schedule`)."""
        if not self._parked:
            return self.env.step(action)
        assert self._last_reset is not None
        obs, info = self._last_reset
        return obs, 0.0, False, bool(self._pending), dict(info)

    def extend_schedule(self, schedule: Schedule) -> None:
        """Append ``(seed, options)`` resets to the schedule (see the class docstring).

        Raises:
            TypeError: if ``schedule`` is not a sequence of pairs.
        """
        self._pending.extend(_checked(schedule, allow_empty=True))


class ScheduledResetsFn:
    """Picklable constructor wrapping another constructor's env in `ScheduledResets`.

    Args:
        env_fn: the real constructor.
    """

    def __init__(self, env_fn: Callable[[], gym.Env]) -> None:
        self.env_fn = env_fn

    def __call__(self) -> gym.Env:
        return ScheduledResets(self.env_fn())
