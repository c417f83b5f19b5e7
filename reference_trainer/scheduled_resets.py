"""`ScheduledResets`: an env wrapper whose resets follow a list given once.

The trainer wraps every training env in it (`reference_trainer.envs.make_vector_env`) so
that evaluations run on the training envs from fixed initial states, across the vector
env's autoresets (see `reference_trainer.vector_eval`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

__all__ = ["SCHEDULE_KEY", "ScheduledResets", "ScheduledResetsFn"]

SCHEDULE_KEY = "reset_schedule"
"""Reset option holding a list of ``(seed, options)`` for this and the following resets."""


class ScheduledResets(gym.Wrapper):
    """Follow a list of ``(seed, options)`` resets, given once, across autoresets.

    ``reset(options={"reset_schedule": [(s0, o0), (s1, o1), ...]})`` resets with
    ``(s0, o0)`` and the next resets without arguments (a vector env's autoresets) with
    ``(s1, o1)``, ... in turn; once the list is used up, or on any reset with explicit
    arguments, resets pass through unchanged.

    Args:
        env: the env to wrap.

    Raises:
        TypeError: (at reset) if the schedule is not a non-empty sequence of pairs.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._pending: list[tuple[int | None, dict[str, Any] | None]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Reset by the schedule (see the class docstring)."""
        if options is not None and SCHEDULE_KEY in options:
            options = dict(options)
            schedule = options.pop(SCHEDULE_KEY)
            if not isinstance(schedule, Sequence) or not schedule:
                raise TypeError(
                    f"options[{SCHEDULE_KEY!r}]: expected a non-empty list of (seed, options), "
                    f"got {schedule!r}"
                )
            self._pending = [(s, None if o is None else dict(o)) for s, o in schedule]
            seed, options = self._pending.pop(0)
        elif seed is None and options is None and self._pending:
            seed, options = self._pending.pop(0)
        else:
            self._pending = []
        return self.env.reset(seed=seed, options=options)


class ScheduledResetsFn:
    """Picklable constructor wrapping another constructor's env in `ScheduledResets`.

    Args:
        env_fn: the real constructor.
    """

    def __init__(self, env_fn: Callable[[], gym.Env]) -> None:
        self.env_fn = env_fn

    def __call__(self) -> gym.Env:
        return ScheduledResets(self.env_fn())
