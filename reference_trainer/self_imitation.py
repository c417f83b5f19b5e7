"""Self-imitation: regress the actor onto its own successful training episodes.

Each rollout's decisions are cut into episodes per env (an episode may span several
rollouts); the episodes that succeeded (``info["is_success"]``, the task's sparse signal)
go into a bounded buffer, and after each PPO update the actor's mean is regressed onto
the actions it took in them (mean squared error, as behaviour cloning does on demos).
This is self-imitation learning (Oh et al. 2018, "Self-Imitation Learning", ICML), in
its success-filtered form: Oh et al. imitate the transitions whose return exceeds the
value estimate; with a binary success signal the filter keeps whole successful
episodes (as in filtered behaviour cloning / reward-weighted regression with a 0/1
return, Peters & Schaal 2007). The data come only from the agent's own exploration
and the environment's reward: no expert is asked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from reference_trainer.agent import ActorCritic, ObsBatch, action_dims_mask, map_obs
from reference_trainer.rollout import Rollout

__all__ = ["SelfImitationStats", "SuccessBuffer", "self_imitation_update", "sign_dims_mask"]


def _obs_column(obs: ObsBatch, t0: int, t1: int, env: int) -> ObsBatch:
    return map_obs(obs, lambda value: value[t0:t1, env].detach().cpu())


def _obs_cat(parts: list[ObsBatch]) -> ObsBatch:
    if isinstance(parts[0], dict):
        return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}  # type: ignore[index]
    return torch.cat(parts)  # type: ignore[arg-type]


def _obs_len(obs: ObsBatch) -> int:
    if isinstance(obs, dict):
        return int(next(iter(obs.values())).shape[0])
    return int(obs.shape[0])


def _obs_index(obs: ObsBatch, index: torch.Tensor, device: torch.device) -> ObsBatch:
    return map_obs(obs, lambda value: value[index].to(device))


@dataclass
class _Episode:
    obs: ObsBatch
    actions: torch.Tensor  # (L, action_dim) float32, flattened actions


class SuccessBuffer:
    """The decisions of the agent's most recent successful training episodes.

    Args:
        num_envs: ``N``, the rollouts' second axis.
        capacity: most decisions kept (the oldest episodes are dropped first); an
            episode longer than the capacity is not kept.
        per_env: split ``capacity`` equally over the envs (each env drops its own oldest
            episodes) and draw equally from every env that has a success. When env ``i``
            trains task ``i % num_tasks``, this gives every task the same share of the
            imitation; a uniform draw over all decisions favours the tasks that succeed
            most often and soonest (a task succeeding 90% of the time in about 115 steps
            fills the buffer about three times as fast as one succeeding 40% of the time).

    Raises:
        ValueError: if ``capacity < 1``, or ``capacity < num_envs`` with ``per_env``.
    """

    def __init__(self, num_envs: int, capacity: int, per_env: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: expected >= 1 decisions, got {capacity}")
        if per_env and capacity < num_envs:
            raise ValueError(
                f"capacity: expected >= num_envs ({num_envs}) decisions with per_env, got {capacity}"
            )
        self.num_envs = num_envs
        self.capacity = capacity
        self.per_env = per_env
        # with per_env: every env's own deque, each holding at most capacity // num_envs
        self._episodes: list[deque[_Episode]] = [deque() for _ in range(num_envs if per_env else 1)]
        self._sizes = [0] * len(self._episodes)
        # per env: the pieces of the episode in progress (obs, actions), across rollouts
        self._pending: list[list[tuple[ObsBatch, torch.Tensor]]] = [[] for _ in range(num_envs)]
        self._cache: tuple[_Episode, torch.Tensor | None] | None = None
        self.episodes_added = 0

    @property
    def _group_capacity(self) -> int:
        return self.capacity // len(self._episodes)

    def __len__(self) -> int:
        """Decisions held."""
        return sum(self._sizes)

    @property
    def num_episodes(self) -> int:
        """Successful episodes held."""
        return sum(len(group) for group in self._episodes)

    def discard_pending(self) -> None:
        """Forget the episodes in progress (call when the envs were reset from outside,
        e.g. after an evaluation on the training envs)."""
        self._pending = [[] for _ in range(self.num_envs)]

    def add(self, rollout: Rollout) -> int:
        """Cut ``rollout`` into per-env episode pieces; keep the episodes that succeeded.

        Args:
            rollout: a ``(T, N, ...)`` rollout; its ``episodes`` say where each episode
                ended (``decision_index``) and whether it succeeded.

        Returns:
            The number of successful episodes added.
        """
        T = int(rollout.rewards.shape[0])
        actions = rollout.actions.detach().reshape(T, self.num_envs, -1).float().cpu()
        ends: dict[int, list[tuple[int, bool]]] = {}
        for record in rollout.episodes:
            ends.setdefault(record.env_index, []).append(
                (record.decision_index, bool(record.success))
            )
        added = 0
        for env in range(self.num_envs):
            start = 0
            for end, success in sorted(ends.get(env, [])):
                self._pending[env].append(
                    (_obs_column(rollout.obs, start, end + 1, env), actions[start : end + 1, env])
                )
                if success:
                    added += self._keep(self._pending[env], env)
                self._pending[env] = []
                start = end + 1
            if start < T:
                self._pending[env].append(
                    (_obs_column(rollout.obs, start, T, env), actions[start:T, env])
                )
        self.episodes_added += added
        return added

    def _keep(self, pieces: list[tuple[ObsBatch, torch.Tensor]], env: int) -> int:
        episode = _Episode(_obs_cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces]))
        length = int(episode.actions.shape[0])
        if length > self._group_capacity:
            return 0
        group = env if self.per_env else 0
        episodes = self._episodes[group]
        episodes.append(episode)
        self._sizes[group] += length
        while self._sizes[group] > self._group_capacity:
            self._sizes[group] -= int(episodes.popleft().actions.shape[0])
        self._cache = None
        return 1

    def _all(self) -> tuple[_Episode, torch.Tensor | None]:
        """Every kept decision, and (per_env) each one's draw weight: 1 / its env's size."""
        if self._cache is None:
            kept = [e for group in self._episodes for e in group]
            everything = _Episode(
                _obs_cat([e.obs for e in kept]), torch.cat([e.actions for e in kept])
            )
            weights = None
            if self.per_env:
                weights = torch.cat(
                    [torch.full((size,), 1.0 / size) for size in self._sizes if size]
                )
            self._cache = (everything, weights)
        return self._cache

    def sample(
        self, batch_size: int, generator: torch.Generator, device: torch.device
    ) -> tuple[ObsBatch, torch.Tensor]:
        """Draw ``batch_size`` decisions with replacement: uniformly, or with ``per_env``
        an env uniformly among those holding a success, then one of its decisions.

        Returns:
            ``(obs, actions)``: observations as stored (a dict if the env's are) and
            ``(batch_size, action_dim)`` float32 actions, on ``device``.

        Raises:
            ValueError: if the buffer is empty.
        """
        if not self.num_episodes:
            raise ValueError("the success buffer is empty: no successful episode yet")
        everything, weights = self._all()
        if weights is None:
            index = torch.randint(0, _obs_len(everything.obs), (batch_size,), generator=generator)
        else:
            index = torch.multinomial(weights, batch_size, replacement=True, generator=generator)
        return _obs_index(everything.obs, index, device), everything.actions[index].to(device)

    def state_dict(self) -> dict:
        """The kept episodes, each with its env (a resumed run keeps imitating them;
        pieces in progress are not saved: the envs restart their episodes on resume)."""
        return {
            "capacity": self.capacity,
            "per_env": self.per_env,
            "episodes_added": self.episodes_added,
            "episodes": [
                {"obs": e.obs, "actions": e.actions, "env": g}
                for g, group in enumerate(self._episodes)
                for e in group
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""
        self._episodes = [deque() for _ in self._episodes]
        self._sizes = [0] * len(self._episodes)
        self._cache = None
        for item in state["episodes"]:  # `_keep` files them all in one group unless per_env
            self._keep([(item["obs"], item["actions"])], int(item.get("env", 0)))
        self.episodes_added = int(state.get("episodes_added", self.num_episodes))
        self.discard_pending()


@dataclass
class SelfImitationStats:
    """What one `self_imitation_update` did: ``loss`` (mean squared action error, mean
    over its steps; None when nothing was imitated), ``steps``, the buffer's
    ``episodes`` and ``decisions``."""

    loss: float | None
    steps: int
    episodes: int
    decisions: int

    def as_scalars(self) -> dict[str, float]:
        """Flat metrics for the run's history (``loss`` omitted when None)."""
        out = {"steps": float(self.steps), "episodes": float(self.episodes)}
        out["decisions"] = float(self.decisions)
        if self.loss is not None:
            out["loss"] = self.loss
        return out


def sign_dims_mask(action_shape: tuple[int, ...], dims: Sequence[int]) -> torch.Tensor | None:
    """The ``sign_mask`` of `self_imitation_update` for ``--self-imitation-sign-dims``
    (`reference_trainer.agent.action_dims_mask`); None for no dims.

    Raises:
        ValueError: for an index outside ``[0, A)``.

    Examples:
        >>> sign_dims_mask((2, 3), [2]).tolist()
        [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    """
    return action_dims_mask(action_shape, dims, "self_imitation_sign_dims")


def self_imitation_update(
    agent: ActorCritic,
    optimizer: torch.optim.Optimizer,
    buffer: SuccessBuffer,
    *,
    steps: int,
    batch_size: int,
    generator: torch.Generator,
    max_grad_norm: float = 0.5,
    sign_mask: torch.Tensor | None = None,
) -> SelfImitationStats:
    """Regress the actor's mean onto buffered successful actions for ``steps`` minibatches.

    Loss per minibatch: the mean over its ``batch_size`` decisions and all action entries
    of ``(mean(obs) - target) ** 2`` (as `reference_trainer.bc` on demos), the target being
    the action taken, or its sign where ``sign_mask`` is 1. The log std and the critic
    are not touched; give ``optimizer`` the actor's parameters only.

    Args:
        agent: the actor-critic.
        optimizer: an optimizer over the actor's mean parameters.
        buffer: the successful episodes; nothing happens while it is empty.
        steps: gradient steps.
        batch_size: decisions per step.
        generator: CPU generator for the draws (reproducible).
        max_grad_norm: gradient norm clip.
        sign_mask: ``(action_dim,)`` of 0/1 over the flattened action (see
            `sign_dims_mask`), or None: every target is the action taken.

    Returns:
        `SelfImitationStats`.
    """
    if buffer.num_episodes == 0 or steps <= 0:
        return SelfImitationStats(None, 0, buffer.num_episodes, len(buffer))
    device = agent.actor_log_std.device
    params = [p for group in optimizer.param_groups for p in group["params"]]
    losses = []
    signs = None if sign_mask is None else sign_mask.to(device) > 0
    for _ in range(steps):
        obs, actions = buffer.sample(batch_size, generator, device)
        if signs is not None:
            actions = torch.where(signs, torch.sign(actions), actions)
        mean, _log_std = agent.distribution(obs)
        loss = (mean - actions).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    return SelfImitationStats(float(np.mean(losses)), steps, buffer.num_episodes, len(buffer))
