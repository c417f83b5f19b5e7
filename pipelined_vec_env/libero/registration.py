"""Gymnasium ids for the LIBERO suites.

Registering imports nothing from ``libero``: entry points are strings, resolved when an
env is made. Ids (one per standard suite; the task is a keyword argument):

    pipelined_vec_env/libero_spatial-v0
    pipelined_vec_env/libero_object-v0
    pipelined_vec_env/libero_goal-v0
    pipelined_vec_env/libero_10-v0
    pipelined_vec_env/libero_90-v0

Examples:
    >>> import gymnasium as gym
    >>> from pipelined_vec_env.libero.registration import register_libero_envs
    >>> register_libero_envs()
    >>> env = gym.make("pipelined_vec_env/libero_goal-v0", task_id=4)  # doctest: +SKIP

The envs truncate at their suite horizon themselves, so the ids set no
``max_episode_steps`` (which would add a second, redundant ``TimeLimit``).
"""

from __future__ import annotations

import gymnasium as gym

from .suites import STANDARD_SUITES

__all__ = ["LIBERO_ENV_IDS", "register_libero_envs"]

NAMESPACE = "pipelined_vec_env"
ENTRY_POINT = "pipelined_vec_env.libero.env:LiberoEnv"

LIBERO_ENV_IDS: dict[str, str] = {suite: f"{NAMESPACE}/{suite}-v0" for suite in STANDARD_SUITES}
"""Suite name -> gymnasium id."""


def register_libero_envs() -> None:
    """Register one gymnasium id per standard LIBERO suite (idempotent).

    Keyword arguments given to ``gymnasium.make`` / ``make_vec`` go to
    `LiberoEnv` (``task_id``, ``cameras``, ...).
    """
    for suite, env_id in LIBERO_ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point=ENTRY_POINT,
                kwargs={"suite": suite},
                disable_env_checker=False,
            )
