"""Generalized advantage estimation, reward scaling and the clipped PPO update.

Sources: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized
Advantage Estimation" (GAE); Schulman et al. 2017, "Proximal Policy Optimization
Algorithms" (clipped surrogate objective); Engstrom et al. 2020 and Andrychowicz et al.
2021 for the code-level details (advantage normalisation, value clipping, reward scaling
by the running std of the discounted return, global gradient clipping).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from reference_trainer.agent import ActorCritic, ObsBatch, RunningMeanStd, map_obs

__all__ = ["PPOHyperparameters", "RewardScaler", "compute_gae", "gaussian_kl", "ppo_update"]


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    episode_ends: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and returns for a rollout of ``T`` decisions.

    The recursion stops at every episode end; a truncated episode's bootstrap value
    ``gamma * V(final_obs)`` must already be folded into ``rewards`` by the caller, which is
    what lets autoreset envs return the next episode's first observation at once.

    Args:
        rewards: ``(T, N)`` float32 rewards (already scaled, bootstrap included).
        values: ``(T, N)`` float32 ``V(s_t)`` from the rollout.
        episode_ends: ``(T, N)`` bool/float, 1 where the episode ended after decision ``t``.
        next_value: ``(N,)`` float32 ``V(s_T)`` of the observation after the last decision.
        gamma: discount per decision.
        gae_lambda: GAE lambda.

    Returns:
        ``(advantages, returns)``, both ``(T, N)`` float32, ``returns = advantages + values``.

    Examples:
        >>> import torch
        >>> adv, ret = compute_gae(torch.ones(2, 1), torch.zeros(2, 1),
        ...                        torch.tensor([[0.0], [1.0]]), torch.zeros(1), 0.5, 1.0)
        >>> adv.squeeze(1).tolist()
        [1.5, 1.0]
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    not_end = 1.0 - episode_ends.to(rewards.dtype)
    for t in reversed(range(num_steps)):
        following_value = next_value if t == num_steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * following_value * not_end[t] - values[t]
        last = delta + gamma * gae_lambda * not_end[t] * last
        advantages[t] = last
    return advantages, advantages + values


class RewardScaler:
    """Divide rewards by the running std of each env's discounted return.

    Updated in time order from a finished rollout, so the scaling does not depend on the
    order in which stages delivered their steps (serial and pipelined loops agree).

    Args:
        num_envs: number of envs (one discounted-return accumulator each).
        gamma: the discount of the accumulated return.
        clip: scaled rewards are clipped to ``[-clip, clip]``.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0) -> None:
        self.gamma = gamma
        self.clip = clip
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.rms = RunningMeanStd(())

    def scale(self, rewards: np.ndarray, episode_ends: np.ndarray) -> np.ndarray:
        """Update the statistics with a rollout and return its scaled rewards.

        Args:
            rewards: ``(T, N)`` raw rewards.
            episode_ends: ``(T, N)`` bool, 1 where the episode ended after step ``t``.

        Returns:
            ``(T, N)`` float32 scaled rewards.
        """
        scaled = np.empty(rewards.shape, dtype=np.float32)
        for t in range(rewards.shape[0]):
            self.returns = self.returns * self.gamma + rewards[t]
            self.rms.update(torch.from_numpy(self.returns))
            std = float(np.sqrt(self.rms.var.item() + 1e-8))
            scaled[t] = np.clip(rewards[t] / std, -self.clip, self.clip)
            self.returns[episode_ends[t].astype(bool)] = 0.0
        return scaled

    def state_dict(self) -> dict:
        """Checkpointable state."""
        return {"returns": self.returns.copy(), "rms": self.rms.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore from `state_dict`."""
        self.returns = np.asarray(state["returns"], dtype=np.float64).copy()
        self.rms.load_state_dict(state["rms"])


@dataclass
class PPOHyperparameters:
    """The knobs of one PPO update (see ``TrainConfig`` for their documentation)."""

    update_epochs: int = 10
    num_minibatches: int = 32
    clip_coef: float = 0.2
    clip_vloss: bool = True
    norm_adv: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None


def gaussian_kl(
    mean: torch.Tensor, log_std: torch.Tensor, ref_mean: torch.Tensor, ref_log_std: torch.Tensor
) -> torch.Tensor:
    """``KL(N(mean, std) || N(ref_mean, ref_std))`` of diagonal Gaussians, summed over dims.

    Args:
        mean, log_std: ``(B, D)`` the current policy (log std broadcastable).
        ref_mean, ref_log_std: ``(B, D)`` the reference policy (broadcastable).

    Returns:
        ``(B,)`` float32, >= 0; 0 where the two agree.

    Examples:
        >>> import torch
        >>> float(gaussian_kl(torch.ones(1, 2), torch.zeros(2), torch.zeros(1, 2), torch.zeros(2)))
        1.0
    """
    var, ref_var = (2 * log_std).exp(), (2 * ref_log_std).exp()
    kl = ref_log_std - log_std + (var + (mean - ref_mean).pow(2)) / (2 * ref_var) - 0.5
    return kl.sum(-1)


def _index_obs(obs: ObsBatch, index: torch.Tensor) -> ObsBatch:
    return map_obs(obs, lambda value: value[index])


_MINIBATCH_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "kl_ref")


def _minibatch_losses(
    agent: ActorCritic,
    obs: ObsBatch,
    actions: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    hp: PPOHyperparameters,
    reference: ActorCritic | None,
) -> dict[str, torch.Tensor]:
    """One minibatch's clipped surrogate, (clipped) value loss, mean entropy, KL to
    ``reference`` (0 without one) and, without gradient, approx KL and clip fraction."""
    new_logprob, entropy, new_value = agent.evaluate(obs, actions)
    log_ratio = new_logprob - logprobs
    ratio = log_ratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > hp.clip_coef).float().mean()
    adv = advantages
    if hp.norm_adv and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = torch.max(
        -adv * ratio, -adv * torch.clamp(ratio, 1 - hp.clip_coef, 1 + hp.clip_coef)
    )
    if hp.clip_vloss:
        clipped = values + torch.clamp(new_value - values, -hp.clip_coef, hp.clip_coef)
        value_loss = (
            0.5 * torch.max((new_value - returns).pow(2), (clipped - returns).pow(2)).mean()
        )
    else:
        value_loss = 0.5 * (new_value - returns).pow(2).mean()
    kl_ref = torch.zeros(())
    if reference is not None:
        mean, log_std = agent.distribution(obs)
        with torch.no_grad():
            ref_mean, ref_log_std = reference.distribution(obs)
        kl_ref = gaussian_kl(mean, log_std, ref_mean, ref_log_std).mean()
    return {
        "policy_loss": surrogate.mean(),
        "value_loss": value_loss,
        "entropy": entropy.mean(),
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
        "kl_ref": kl_ref,
    }


def ppo_update(
    agent: ActorCritic,
    optimizer: torch.optim.Optimizer,
    obs: ObsBatch,
    actions: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    hp: PPOHyperparameters,
    generator: torch.Generator,
    *,
    update_actor: bool = True,
    reference: ActorCritic | None = None,
    kl_coef: float = 0.0,
) -> dict[str, float]:
    """Run the clipped PPO update over a flattened batch of ``B`` decisions.

    Fine-tuning from a warm start adds two options: ``update_actor=False`` trains the
    critic alone (value warm-up: the loss is the value loss only, so the actor and its log
    std get no gradient), and ``kl_coef > 0`` adds ``kl_coef * KL(pi || pi_ref)`` on the
    minibatch's observations, a pull towards the ``reference`` policy (the warm start),
    as in KL-regularised fine-tuning (Jaques et al. 2019; Ouyang et al. 2022).

    Args:
        agent: the actor-critic to train.
        optimizer: its optimizer.
        obs: ``(B, ...)`` observations (or a dict of them).
        actions: ``(B, *action_shape)`` unclipped actions taken.
        logprobs: ``(B,)`` log-probs under the rollout policy.
        advantages: ``(B,)`` GAE advantages.
        returns: ``(B,)`` value targets.
        values: ``(B,)`` values under the rollout policy (for value clipping).
        hp: update hyperparameters.
        generator: CPU generator for the minibatch shuffles (reproducible updates).
        update_actor: False: value warm-up, only the critic learns.
        reference: the frozen reference policy of the KL term (needed when
            ``kl_coef > 0``).
        kl_coef: weight of the KL term (0: none).

    Returns:
        Means over the last epoch's minibatches of ``policy_loss``, ``value_loss``,
        ``entropy``, ``approx_kl`` (k3 estimator), ``clip_fraction``, ``kl_ref`` (KL to
        the reference, 0 without one), plus ``explained_variance`` of the value targets
        and ``epochs`` actually run.

    Raises:
        ValueError: if the batch is smaller than ``num_minibatches``, or ``kl_coef > 0``
            without a ``reference``.
    """
    if kl_coef > 0 and reference is None:
        raise ValueError("kl_coef > 0 needs a reference policy")
    batch_size = advantages.shape[0]
    if batch_size < hp.num_minibatches:
        raise ValueError(
            f"batch of {batch_size} decisions is smaller than num_minibatches={hp.num_minibatches}"
        )
    minibatch_size = batch_size // hp.num_minibatches
    stats: dict[str, list[float]] = {}
    epochs_run = 0
    for _epoch in range(hp.update_epochs):
        epochs_run += 1
        stats = {k: [] for k in _MINIBATCH_STATS}
        order = torch.randperm(batch_size, generator=generator).to(advantages.device)
        for start in range(0, minibatch_size * hp.num_minibatches, minibatch_size):
            index = order[start : start + minibatch_size]
            losses = _minibatch_losses(
                agent,
                _index_obs(obs, index),
                actions[index],
                logprobs[index],
                advantages[index],
                returns[index],
                values[index],
                hp,
                reference if update_actor else None,
            )
            if update_actor:
                loss = (
                    losses["policy_loss"]
                    - hp.ent_coef * losses["entropy"]
                    + hp.vf_coef * losses["value_loss"]
                    + kl_coef * losses["kl_ref"]
                )
            else:
                loss = hp.vf_coef * losses["value_loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), hp.max_grad_norm)
            optimizer.step()
            for key in _MINIBATCH_STATS:
                stats[key].append(losses[key].detach().item())
        if hp.target_kl is not None and np.mean(stats["approx_kl"]) > hp.target_kl:
            break
    result = {key: float(np.mean(values_)) for key, values_ in stats.items()}
    target_var = returns.var()
    explained = 1.0 - (returns - values).var() / target_var if target_var > 0 else torch.tensor(0.0)
    result["explained_variance"] = float(explained)
    result["epochs"] = float(epochs_run)
    return result
