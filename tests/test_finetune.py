"""Fine-tuning from a warm start, end to end on a debug env (no LIBERO): value warm-up,
per-dimension std, the KL term, the frozen normaliser, evaluation on the training envs,
and the summary's before/after success keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from pipelined_vec_env.debug_envs import ReachEnv
from reference_trainer.checkpoint import find_checkpoint
from reference_trainer.config import TrainConfig
from reference_trainer.ppo import gaussian_kl
from reference_trainer.scheduled_resets import ScheduledResets
from reference_trainer.train import train

from .conftest import ReachFactory, tiny_train_config

pytestmark = pytest.mark.timeout(120)


def _config(tmp_path: Path, name: str, **overrides: Any) -> TrainConfig:
    config = tiny_train_config(
        tmp_path,
        name,
        env_id="reach",
        num_steps=8,
        total_timesteps=32,
        num_minibatches=2,
        update_epochs=2,
        hidden_sizes=(8,),
        eval_episodes=5,
        checkpoint_every=1,
    )
    return dataclasses.replace(config, **overrides)


def _weights(run_dir: str) -> dict[str, torch.Tensor]:
    return torch.load(find_checkpoint(run_dir), weights_only=False)["agent"]


def _changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], prefix: str) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a if k.startswith(prefix))


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory) -> str:
    """A trainer run whose weights are the warm start of the fine-tuning runs."""
    tmp = tmp_path_factory.mktemp("warm")
    return train(_config(tmp, "warm"), ReachFactory())["run_dir"]


def test_value_warmup_moves_only_the_critic_and_keeps_the_set_std(tmp_path, warm_start):
    start = _weights(warm_start)
    log_std = (-1.0, -3.0)
    summary = train(
        _config(
            tmp_path,
            "warmup",
            init_checkpoint=warm_start,
            init_log_std_per_dim=log_std,
            value_warmup_iterations=2,
            kl_coef=0.5,
            freeze_obs_norm=True,
        ),
        ReachFactory(),
    )
    assert summary["iterations"] == 2
    after = _weights(summary["run_dir"])
    assert _changed(start, after, "critic"), "the critic should learn during the warm-up"
    for key in after:
        if key.startswith(("actor_mean", "actor_encoder")):
            assert torch.equal(start[key], after[key]), key
    assert after["actor_log_std"].tolist() == pytest.approx(list(log_std))
    assert torch.equal(start["obs_rms.mean"], after["obs_rms.mean"])  # frozen normaliser


def test_after_the_warmup_the_actor_moves_and_the_kl_term_pulls_back(tmp_path, warm_start):
    start = _weights(warm_start)
    summary = train(
        _config(
            tmp_path,
            "finetune",
            init_checkpoint=warm_start,
            init_log_std_per_dim=(-1.0, -3.0),
            value_warmup_iterations=1,
            kl_coef=0.5,
            kl_decay=0.5,
            kl_coef_min=0.3,
            total_timesteps=64,
            eval_at_start=True,
        ),
        ReachFactory(),
    )
    after = _weights(summary["run_dir"])
    assert _changed(start, after, "actor_mean"), "the actor should move after the warm-up"
    assert not torch.equal(start["obs_rms.count"], after["obs_rms.count"])  # not frozen here
    state = torch.load(find_checkpoint(summary["run_dir"]), weights_only=False)
    history = state["history"]
    assert [h["value_warmup"] for h in history] == [1.0, 0.0, 0.0, 0.0]
    # decays by 0.5 an iteration after the warm-up, down to its floor of 0.3
    assert [h["kl_coef"] for h in history] == pytest.approx([0.5, 0.5, 0.3, 0.3])
    assert history[0]["train/kl_ref"] == 0.0 and history[2]["train/kl_ref"] > 0.0


def test_a_resumed_run_keeps_pulling_towards_the_warm_start(tmp_path, warm_start):
    start = _weights(warm_start)
    config = _config(tmp_path, "resumed", init_checkpoint=warm_start, kl_coef=0.5)
    first = train(config, ReachFactory())
    resumed = dataclasses.replace(
        config, init_checkpoint=None, resume=first["run_dir"], total_timesteps=48
    )
    assert train(resumed, ReachFactory())["iterations"] == 3
    state = torch.load(find_checkpoint(first["run_dir"]), weights_only=False)
    for key, value in state["kl_reference"].items():
        if key.startswith(("actor_mean", "actor_encoder")):
            assert torch.equal(value, start[key]), key  # the warm start, not a fresh init
    plain = _config(tmp_path, "plain")  # trained without the KL term: nothing to pull to
    train(plain, ReachFactory())
    with pytest.raises(ValueError, match="KL reference"):
        train(
            dataclasses.replace(plain, resume=str(tmp_path / "plain"), kl_coef=0.5), ReachFactory()
        )


def test_summary_reports_success_before_and_after_on_fixed_init_states(tmp_path, warm_start):
    summary = train(
        _config(tmp_path, "evals", init_checkpoint=warm_start, eval_at_start=True),
        ReachFactory(),
    )
    first, last = summary["evaluations"][0], summary["evaluations"][-1]
    assert first["iteration"] == 0 and last["iteration"] == summary["iterations"]
    assert summary["eval_episodes"] == 5
    for key, entry in (("eval_success_rate_initial", first), ("eval_success_rate_final", last)):
        assert 0.0 <= summary[key] <= 1.0
        assert summary[key] == pytest.approx(np.mean(entry["successes"]))
        assert len(entry["successes"]) == 5


def test_evaluation_on_the_training_envs_matches_single_env_episodes(tmp_path, warm_start):
    """Each evaluation episode starts from its own init state: replaying the mean policy
    from that state in one env gives the same return."""
    from reference_trainer.agent import ActorCritic, obs_to_tensor
    from reference_trainer.checkpoint import load_init_checkpoint

    summary = train(
        _config(tmp_path, "same", init_checkpoint=warm_start, eval_at_start=True, eval_episodes=5),
        ReachFactory(),
    )
    env = ReachEnv(horizon=12, num_init_states=10)
    agent = ActorCritic(env.observation_space, env.action_space, hidden_sizes=(8,))
    load_init_checkpoint(agent, find_checkpoint(warm_start), torch.device("cpu"))
    agent.eval()
    # the first evaluation ran the warm start from init states 0..4: compare the mean
    expected = []
    for j in range(5):
        obs, _ = env.reset(options={"init_state_id": j})
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                action = agent.act(obs_to_tensor(obs[None], torch.device("cpu")), None).action
            obs, reward, terminated, truncated, _ = env.step(np.clip(action[0].numpy(), -1, 1))
            total += reward
            done = terminated or truncated
        expected.append(total)
    assert summary["evaluations"][0]["return_mean"] == pytest.approx(np.mean(expected), rel=1e-4)


def test_per_dimension_std_must_fit_the_action(tmp_path, warm_start):
    with pytest.raises(ValueError, match="init_log_std_per_dim"):
        train(
            _config(tmp_path, "bad", init_checkpoint=warm_start, init_log_std_per_dim=(0.0,) * 3),
            ReachFactory(),
        )


def test_scheduled_resets_follow_the_list_then_pass_through():
    env = ScheduledResets(ReachEnv(num_init_states=10))
    _, info = env.reset(options={"reset_schedule": [(None, {"init_state_id": 7}), (3, None)]})
    assert info["init_state_id"] == 7
    assert env.reset()[1]["init_state_id"] == 3  # seed 3 -> init state 3
    assert env.reset(seed=5)[1]["init_state_id"] == 5  # explicit arguments pass through
    env.reset(
        options={"reset_schedule": [(None, {"init_state_id": 1}), (None, {"init_state_id": 2})]}
    )
    assert env.reset(seed=4)[1]["init_state_id"] == 4  # an explicit reset clears the rest
    with pytest.raises(TypeError, match="reset_schedule"):
        env.reset(options={"reset_schedule": []})


def test_gaussian_kl_is_zero_for_equal_policies_and_positive_otherwise():
    mean, log_std = torch.randn(4, 3), torch.randn(3)
    assert torch.allclose(gaussian_kl(mean, log_std, mean, log_std), torch.zeros(4), atol=1e-6)
    assert (gaussian_kl(mean + 0.1, log_std, mean, log_std) > 0).all()


def test_actor_learning_rate_gives_the_actor_its_own_adam_group():
    from reference_trainer.agent import ActorCritic
    from reference_trainer.training_run import _param_groups

    env = ReachEnv()
    agent = ActorCritic(env.observation_space, env.action_space, hidden_sizes=(4,))
    config = TrainConfig(learning_rate=1e-3)
    assert [g["lr"] for g in _param_groups(agent, config)] == [1e-3]
    actor, critic = _param_groups(agent, dataclasses.replace(config, actor_learning_rate=1e-5))
    assert (actor["lr"], critic["lr"]) == (1e-5, 1e-3)
    assert any(p is agent.actor_log_std for p in actor["params"])
    assert {id(p) for p in critic["params"]} == {
        id(p) for m in (agent.critic, agent.critic_encoder) for p in m.parameters()
    }


def test_explore_dims_leave_the_other_dimensions_at_the_mean():
    from reference_trainer.agent import ActorCritic

    space = gym.spaces.Box(-1.0, 1.0, shape=(2, 3), dtype=np.float32)  # a chunk of 2 actions
    agent = ActorCritic(gym.spaces.Box(-1, 1, (4,), np.float32), space, hidden_sizes=(4,))
    agent.set_explore_dims([0, 2])
    obs, noise = torch.zeros(5, 4), torch.randn(5, 6)
    mean = agent.act(obs, None).action.reshape(5, 6)
    sampled = agent.act(obs, noise)
    moved = (sampled.action.reshape(5, 6) - mean).abs() > 0
    assert moved[:, [0, 2, 3, 5]].all() and not moved[:, [1, 4]].any()
    logprob, entropy, _ = agent.evaluate(obs, sampled.action)
    assert torch.allclose(logprob, sampled.logprob)
    per_dim = 0.5 + 0.5 * np.log(2 * np.pi) + agent.actor_log_std[0].detach().item()
    assert torch.allclose(entropy, torch.full((5,), 4 * per_dim))
    with pytest.raises(ValueError, match=r"^dims: expected indices in \[0, 3\)"):
        agent.set_explore_dims([3])
    with pytest.raises(ValueError, match="^explore_dims: "):  # the caller names its flag
        agent.set_explore_dims([3], "explore_dims")
