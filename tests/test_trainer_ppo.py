"""GAE, reward scaling, running statistics and the PPO update of the reference trainer."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from reference_trainer.agent import ActorCritic, RunningMeanStd
from reference_trainer.metrics import RolloutTimings, ideal_pipelined_fraction, summarize_episodes
from reference_trainer.ppo import PPOHyperparameters, RewardScaler, compute_gae, ppo_update


def _gae_by_definition(rewards, values, ends, next_value, gamma, lam):
    """A_t = sum_l (gamma*lam)^l delta_{t+l}, summed explicitly up to the episode's end."""
    T, N = rewards.shape
    values_ext = np.concatenate([values, next_value[None]], axis=0)
    adv = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                bootstrap = 0.0 if ends[k, n] else gamma * values_ext[k + 1, n]
                delta = rewards[k, n] + bootstrap - values[k, n]
                total += weight * delta
                if ends[k, n]:
                    break
                weight *= gamma * lam
            adv[t, n] = total
    return adv


def test_gae_matches_its_definition():
    rng = np.random.default_rng(0)
    T, N = 9, 3
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    ends = rng.random((T, N)) < 0.25
    next_value = rng.normal(size=N)
    adv, ret = compute_gae(
        torch.tensor(rewards),
        torch.tensor(values),
        torch.tensor(ends),
        torch.tensor(next_value),
        gamma=0.9,
        gae_lambda=0.8,
    )
    expected = _gae_by_definition(rewards, values, ends, next_value, 0.9, 0.8)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), expected + values, rtol=1e-10, atol=1e-10)


def test_gae_with_lambda_one_and_zero_values_is_the_discounted_return():
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    adv, _ = compute_gae(
        rewards, torch.zeros(3, 1), torch.zeros(3, 1), torch.tensor([10.0]), 0.5, 1.0
    )
    assert adv.squeeze(1).tolist() == [
        1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 10,
        2 + 0.5 * 3 + 0.25 * 10,
        3 + 0.5 * 10,
    ]


def test_running_mean_std_matches_numpy_over_all_batches():
    rng = np.random.default_rng(1)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (5, 1, 17)]
    rms = RunningMeanStd((4,), epsilon=0.0)
    for batch in batches:
        rms.update(torch.tensor(batch))
    everything = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean.numpy(), everything.mean(0), rtol=1e-10)
    np.testing.assert_allclose(rms.var.numpy(), everything.var(0), rtol=1e-10)


def test_reward_scaler_divides_by_the_std_of_discounted_returns_and_restores():
    rng = np.random.default_rng(2)
    rewards = rng.normal(50.0, 10.0, size=(40, 2))
    ends = np.zeros((40, 2), dtype=bool)
    ends[19] = True
    scaler = RewardScaler(2, gamma=0.9, clip=1e9)
    first = scaler.scale(rewards[:20], ends[:20])
    # recompute the last step's divisor from the discounted returns seen so far
    returns, seen = np.zeros(2), []
    for t in range(20):
        returns = returns * 0.9 + rewards[t]
        seen.append(returns.copy())
    std = np.sqrt(np.concatenate(seen).var() + 1e-8)
    np.testing.assert_allclose(first[19], rewards[19] / std, rtol=1e-3)
    restored = RewardScaler(2, gamma=0.9, clip=1e9)
    restored.load_state_dict(scaler.state_dict())
    np.testing.assert_array_equal(
        restored.scale(rewards[20:], ends[20:]), scaler.scale(rewards[20:], ends[20:])
    )


def test_ppo_update_raises_the_probability_of_advantaged_actions():
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    act_space = gym.spaces.Box(-1, 1, (2, 2), np.float32)
    agent = ActorCritic(obs_space, act_space, (16,), normalize_obs=False)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-2)
    obs = torch.randn(64, 3)
    with torch.no_grad():
        out = agent.act(obs, torch.randn(64, 4))
    advantages = torch.where(
        out.action.reshape(64, -1)[:, 0] > out.action.reshape(64, -1)[:, 0].median(), 1.0, -1.0
    )
    good = advantages > 0
    stats = ppo_update(
        agent,
        optimizer,
        obs,
        out.action,
        out.logprob,
        advantages,
        out.value + advantages,
        out.value,
        PPOHyperparameters(update_epochs=4, num_minibatches=4),
        torch.Generator().manual_seed(0),
    )
    with torch.no_grad():
        new_logprob, _, _ = agent.evaluate(obs, out.action)
    change = new_logprob - out.logprob
    assert change[good].mean() > change[~good].mean()
    assert 0.0 <= stats["clip_fraction"] <= 1.0
    assert stats["epochs"] == 4


def test_ppo_update_rejects_a_batch_smaller_than_the_minibatch_count():
    agent = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (1,)), (4,))
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="num_minibatches"):
        ppo_update(
            agent,
            torch.optim.Adam(agent.parameters()),
            torch.zeros(2, 3),
            torch.zeros(2, 1),
            x,
            x,
            x,
            x,
            PPOHyperparameters(num_minibatches=4),
            torch.Generator(),
        )


def test_actor_critic_handles_dict_observations_with_images():
    space = gym.spaces.Dict(
        {
            "state": gym.spaces.Box(-np.inf, np.inf, (5,), np.float32),
            "agentview_image": gym.spaces.Box(0, 255, (40, 48, 3), np.uint8),
        }
    )
    agent = ActorCritic(space, gym.spaces.Box(-1, 1, (4, 7), np.float32), (8,))
    obs = {
        "state": torch.randn(3, 5),
        "agentview_image": torch.randint(0, 256, (3, 40, 48, 3), dtype=torch.uint8),
    }
    out = agent.act(obs, torch.randn(3, 28))
    assert out.action.shape == (3, 4, 7)
    logprob, entropy, value = agent.evaluate(obs, out.action)
    torch.testing.assert_close(logprob, out.logprob)
    assert entropy.shape == value.shape == (3,)
    with pytest.raises(ValueError, match="36x36"):
        ActorCritic(
            gym.spaces.Dict({"img": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)}),
            gym.spaces.Box(-1, 1, (2,)),
        )


def test_metrics_bubble_and_ideal_bound():
    timings = RolloutTimings(
        rollout_s=2.0, env_wait_s=1.5, inference_s=0.5, decisions=10, env_steps=40
    )
    assert timings.bubble_fraction == pytest.approx(0.75)
    assert timings.env_steps_per_s == pytest.approx(20.0)
    assert ideal_pipelined_fraction(3.0, 1.0) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        ideal_pipelined_fraction(0.0, 0.0)
    assert summarize_episodes([]) == {"episodes": 0.0}
