"""Which of each task's init states a LIBERO job's demos, training and evaluation use.

Each LIBERO task has 50 fixed init states. The job splits them three ways: the demos'
(the scripted expert plays them), training's (training resets draw from them) and the
evaluation's (held out: no demo and no training episode starts there). Evaluation episode
``j`` plays task ``tasks[j % T]`` from the ``j // T``-th evaluation init state, so an
evaluation during training that plays its first episodes plays the first init states.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["DEFAULT_INIT_STATES", "check_init_states", "eval_episode_counts", "parse_ids"]

DEFAULT_INIT_STATES: dict[bool, dict[str, str]] = {
    True: {"demo": "0:2", "train": "0:45", "eval": "45:50"},
    False: {"demo": "0:6", "train": "0:30", "eval": "30:50"},
}
"""The split with several tasks (True) and with one (False): few demos of every task leave
BC room to improve (six of each of ten tasks already solve 0.96-0.98)."""


def parse_ids(text: str) -> tuple[int, ...]:
    """Init-state ids from ``"a:b"`` (ids a to b-1) or ``"0,3,7"``."""
    from pipelined_vec_env.libero.collect import parse_init_states

    return tuple(parse_init_states(text))


def check_init_states(config: Any) -> None:
    """Raise ValueError if an evaluation init state of ``config`` (``init_states(which)``)
    is also a demo's or training's."""
    eval_ids = set(config.init_states("eval"))
    for which in ("demo", "train"):
        overlap = eval_ids & set(config.init_states(which))
        if overlap:
            raise ValueError(
                f"--{which}-init-states and --eval-init-states share init states "
                f"{sorted(overlap)}; the evaluation must use init states no demo and no "
                "training episode uses"
            )


def eval_episode_counts(config: Any, tasks: list[int]) -> Any:
    """The config with ``eval_episodes`` (every task times --eval-init-states) and
    ``eval_during_episodes`` (every task times --eval-during-init-states) set.

    Raises:
        ValueError: if --eval-during-init-states is negative or more than
            --eval-init-states has.
    """
    eval_ids = config.init_states("eval")
    during = config.eval_during_init_states
    if not 0 <= during <= len(eval_ids):
        raise ValueError(
            f"--eval-during-init-states: expected 0 to {len(eval_ids)} (the number of "
            f"--eval-init-states), got {during}"
        )
    return dataclasses.replace(
        config,
        eval_episodes=len(tasks) * len(eval_ids),
        eval_during_episodes=len(tasks) * during,
    )
