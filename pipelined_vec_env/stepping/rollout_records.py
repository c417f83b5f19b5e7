"""What a decoupled run records and returns: each env's `Transition` as it completes, the
per-env `EnvTrajectory`, the run's `DecoupledRollout`, and `RunState`, the per-env
bookkeeping of one [`InferenceChannel.run`][pipelined_vec_env.stepping.channel.InferenceChannel.run]
(steps, episodes, the step in flight, the recorded columns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from ..batching import concat_batches, stack_batches, swap_leading_axes
from .actors import ActorStats

__all__ = ["COLUMNS", "DecoupledRollout", "EnvTrajectory", "RunState", "Transition", "trajectory"]


@dataclass
class Transition:
    """One step of one env, as passed to ``on_transition``.

    Attributes:
        env_id: Global env id.
        step: Index of this step in the env's stream during the current run (0-based).
        obs: The observation the action was computed on (a batch of one, in gymnasium's
            batched layout).
        action: The action sent (a batch of one).
        extras: The policy's extras for this env (arrays with leading dimension one).
        reward: The reward of the step.
        terminated: Whether the step ended the episode by termination.
        truncated: Whether the step ended the episode by truncation.
        info: The step's info dict for this env alone, split from the batch as
            `infos.split_infos` does (gymnasium's masks removed; Python numbers where the
            env wrote them).
        actor: Index of the actor that computed the action.
    """

    env_id: int
    step: int
    obs: Any
    action: Any
    extras: dict[str, np.ndarray]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    actor: int


@dataclass
class EnvTrajectory:
    """The transitions one env produced during a run, in order.

    Attributes:
        env_id: Global env id.
        obs: ``(L, ...)`` observations the actions were computed on.
        actions: ``(L, ...)`` actions.
        extras: Per key ``(L, ...)`` arrays of the policy's extras.
        rewards: ``(L,)`` float64.
        terminations: ``(L,)`` bool.
        truncations: ``(L,)`` bool.
        infos: ``L`` per-step info dicts of this env.
        actors: ``(L,)`` int64 index of the actor behind each action.
    """

    env_id: int
    obs: Any
    actions: Any
    extras: dict[str, np.ndarray]
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: list[dict[str, Any]]
    actors: np.ndarray

    def __len__(self) -> int:
        return len(self.rewards)


@dataclass
class DecoupledRollout:
    """The result of [`InferenceChannel.run`][pipelined_vec_env.stepping.channel.InferenceChannel.run].

    Attributes:
        steps: ``(num_envs,)`` int64 steps each env took during the run.
        final_obs: A batch of ``num_envs`` observations in env order: each env's latest
            observation, on which its next action will be computed (bootstrap it).
        trajectories: One [`EnvTrajectory`][pipelined_vec_env.stepping.rollout_records.EnvTrajectory] per env in env order, or None when the
            run did not record.
        actor_stats: One [`ActorStats`][pipelined_vec_env.stepping.actors.ActorStats] per actor for this run.
        turnaround: Seconds from each env batch's arrival in the driver to its actions
            being sent back (queue wait + inference + hand-over).
        wall_seconds: Duration of the run.
    """

    steps: np.ndarray
    final_obs: Any
    trajectories: list[EnvTrajectory] | None
    actor_stats: list[ActorStats]
    turnaround: list[float]
    wall_seconds: float

    def stack(self, observation_space: spaces.Space, action_space: spaces.Space) -> dict[str, Any]:
        """Time-major arrays ``(T, num_envs, ...)`` of a run where every env took ``T`` steps.

        Args:
            observation_space: The env's ``single_observation_space``.
            action_space: The env's ``single_action_space``.

        Returns:
            ``obs``, ``actions``, ``rewards``, ``terminations``, ``truncations`` and
            ``extras`` (a dict) indexed ``[t, env]``, env ``i`` being the global env ``i``;
            ``final_obs`` ``(num_envs, ...)``.

        Raises:
            ValueError: The run did not record, or envs took different numbers of steps.
        """
        if self.trajectories is None:
            raise ValueError("stack: this run did not record trajectories (record=False)")
        lengths = {len(t) for t in self.trajectories}
        if len(lengths) != 1:
            raise ValueError(f"stack: envs took different numbers of steps {sorted(lengths)}")
        trajs = self.trajectories
        keys = trajs[0].extras.keys()
        return {
            "obs": swap_leading_axes(
                observation_space, stack_batches(observation_space, [t.obs for t in trajs])
            ),
            "actions": swap_leading_axes(
                action_space, stack_batches(action_space, [t.actions for t in trajs])
            ),
            "rewards": np.stack([t.rewards for t in trajs], axis=1),
            "terminations": np.stack([t.terminations for t in trajs], axis=1),
            "truncations": np.stack([t.truncations for t in trajs], axis=1),
            "extras": {k: np.stack([t.extras[k] for t in trajs], axis=1) for k in keys},
            "final_obs": self.final_obs,
        }


#: A run's recorded columns, per env.
COLUMNS = ("obs", "actions", "rewards", "terms", "truncs", "infos", "actors", "extras")


@dataclass
class RunState:
    """One `InferenceChannel.run`'s bookkeeping, per env: steps and episodes taken, the
    observation its posted request carries, its step in flight ``(obs, action, extras,
    actor)``, and its recorded columns."""

    steps_per_env: int
    record: bool
    on_transition: Callable[[Transition], None] | None
    episodes_per_env: int | None
    participants: set[int]
    steps: np.ndarray
    episodes: np.ndarray
    columns: list[dict[str, list[Any]]]
    posted_obs: dict[int, Any] = field(default_factory=dict)
    acted: dict[int, tuple[Any, Any, dict[str, np.ndarray], int]] = field(default_factory=dict)
    turnaround: list[float] = field(default_factory=list)
    posted: set[int] = field(default_factory=set)  # envs whose request is at the actors

    @classmethod
    def start(
        cls,
        num_envs: int,
        steps_per_env: int,
        record: bool,
        on_transition: Callable[[Transition], None] | None,
        episodes_per_env: int | None,
        participants: set[int],
    ) -> RunState:
        columns = [{key: [] for key in COLUMNS} for _ in range(num_envs)]
        return cls(
            steps_per_env,
            record,
            on_transition,
            episodes_per_env,
            participants,
            steps=np.zeros(num_envs, dtype=np.int64),
            episodes=np.zeros(num_envs, dtype=np.int64),
            columns=columns,
        )

    @property
    def keep(self) -> bool:
        """Whether observations and actions are kept (recorded or passed on)."""
        return self.record or self.on_transition is not None

    def complete(self, g: int, reward: float, term: bool, trunc: bool, info: dict) -> None:
        """Env ``g``'s step in flight answered: record it, pass it on, count it."""
        prev_obs, action, extras, actor = self.acted.pop(g)
        if self.record:
            col = self.columns[g]
            col["obs"].append(prev_obs)
            col["actions"].append(action)
            col["extras"].append(extras)
            col["rewards"].append(reward)
            col["terms"].append(term)
            col["truncs"].append(trunc)
            col["infos"].append(info)
            col["actors"].append(actor)
        if self.on_transition is not None:
            self.on_transition(
                Transition(
                    g,
                    int(self.steps[g]),
                    prev_obs,
                    action,
                    extras,
                    reward,
                    term,
                    trunc,
                    info,
                    actor,
                )
            )
        self.steps[g] += 1
        self.episodes[g] += bool(term or trunc)

    def done(self, g: int) -> bool:
        """Whether env ``g`` is out of this run (not taking part, or its steps or
        episodes reached)."""
        return (
            g not in self.participants
            or self.steps[g] >= self.steps_per_env
            or (self.episodes_per_env is not None and self.episodes[g] >= self.episodes_per_env)
        )


def trajectory(
    env_id: int, col: dict[str, list[Any]], obs_space: spaces.Space, act_space: spaces.Space
) -> EnvTrajectory:
    """Env ``env_id``'s `EnvTrajectory` from its recorded columns ``col`` (`RunState.columns`)."""
    length = len(col["rewards"])
    extras: dict[str, np.ndarray] = {}
    if length:
        keys = col["extras"][0].keys()
        extras = {k: np.concatenate([e[k] for e in col["extras"]], axis=0) for k in keys}
    return EnvTrajectory(
        env_id=env_id,
        obs=concat_batches(obs_space, col["obs"]) if length else None,
        actions=concat_batches(act_space, col["actions"]) if length else None,
        extras=extras,
        rewards=np.asarray(col["rewards"], dtype=np.float64),
        terminations=np.asarray(col["terms"], dtype=np.bool_),
        truncations=np.asarray(col["truncs"], dtype=np.bool_),
        infos=col["infos"],
        actors=np.asarray(col["actors"], dtype=np.int64),
    )
