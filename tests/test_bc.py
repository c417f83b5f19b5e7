"""Behaviour cloning on synthetic demos, and the trainer's --init-checkpoint (BC or trainer)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("h5py")

from pipelined_vec_env.libero.demos import Demo, DemoSet, write_demos  # noqa: E402
from reference_trainer.bc import BCConfig, chunk_targets, train_bc  # noqa: E402
from reference_trainer.checkpoint import BC_FORMAT, find_checkpoint  # noqa: E402
from reference_trainer.config import TrainConfig  # noqa: E402
from reference_trainer.train import train  # noqa: E402

from .conftest import tiny_train_config


def _synthetic_demos(
    path: Path, obs_dim: int, action_dim: int, num_demos: int = 12, length: int = 40
) -> None:
    """Episodes of a random walk labelled by a fixed smooth expert ``tanh(W x)``."""
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(action_dim, obs_dim))
    demos = []
    for k in range(num_demos):
        x = np.cumsum(rng.normal(scale=0.3, size=(length, obs_dim)), axis=0) + rng.normal(
            size=obs_dim
        )
        actions = np.tanh(x @ weights.T / np.sqrt(obs_dim))
        demos.append(
            Demo(
                obs={"obs": x.astype(np.float32)},
                actions=actions.astype(np.float32),
                rewards=np.zeros(length, np.float32),
                dones=np.zeros(length, np.uint8),
                attrs={"init_state_id": k},
            )
        )
    write_demos(path, DemoSet(demos=demos, attrs={"env_name": "synthetic"}))


def test_chunk_targets_repeat_the_last_action():
    actions = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = chunk_targets(actions, 3)
    assert out.shape == (4, 3, 2)
    np.testing.assert_array_equal(out[0], actions[0:3])
    np.testing.assert_array_equal(out[3], [actions[3]] * 3)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_targets(actions, 0)


@pytest.mark.parametrize("chunk_size", [1, 4])
def test_bc_lowers_the_heldout_action_error(tmp_path, chunk_size):
    demos = tmp_path / "demos.hdf5"
    _synthetic_demos(demos, obs_dim=6, action_dim=3)
    result = train_bc(
        BCConfig(
            demos=str(demos),
            output=str(tmp_path / "bc.pt"),
            obs_keys=("obs",),
            chunk_size=chunk_size,
            hidden_sizes=(64, 64),
            max_epochs=150,
            patience=150,
        )
    )
    m = result.metrics
    # the expert is a smooth function of the observation: cloning beats the mean action by far
    assert m["heldout_mse"] < 0.25 * m["heldout_mse_baseline"], m
    assert m["heldout_demos"] == 2 and m["train_demos"] == 10
    assert len(m["heldout_rmse_per_dim"]) == 3
    assert result.curve[0][2] > m["heldout_mse"]  # the held-out error came down
    state = torch.load(result.checkpoint, weights_only=False)
    assert state["format"] == BC_FORMAT and state["obs_keys"] == ["obs"]
    assert state["action_shape"] == ([chunk_size, 3] if chunk_size > 1 else [3])
    assert not any(k.startswith("critic") for k in state["actor"])
    # the normaliser is fitted on the training demos and travels with the actor
    assert state["actor"]["obs_rms.count"] == m["train_samples"]
    assert torch.all(state["actor"]["obs_rms.var"] > 0.01**2 - 1e-12)


def test_bc_holds_out_the_last_demos_whatever_the_seed(tmp_path):
    demos = tmp_path / "demos.hdf5"
    _synthetic_demos(demos, obs_dim=4, action_dim=2, num_demos=6, length=10)

    def heldout(seed: int, how: str) -> list[int]:
        config = BCConfig(
            demos=str(demos),
            output=str(tmp_path / f"bc_{how}_{seed}.pt"),
            obs_keys=("obs",),
            hidden_sizes=(8,),
            max_epochs=2,
            heldout=how,
            seed=seed,
        )
        return train_bc(config).metrics["heldout_demo_indices"]

    assert heldout(1, "last") == heldout(2, "last") == [5]  # 20% of 6 demos: one
    drawn = {tuple(heldout(seed, "random")) for seed in range(4)}
    assert len(drawn) > 1  # drawn with the seed: some seeds hold out another demo


def _tiny(tmp_path: Path, name: str, **overrides) -> TrainConfig:
    config = tiny_train_config(
        tmp_path,
        name,
        num_stages=1,
        num_steps=8,
        total_timesteps=16,
        num_minibatches=2,
        learning_rate=0.0,  # weights stay where they started: what was loaded is visible
        anneal_lr=False,
        eval_episodes=0,
        checkpoint_every=10,
    )
    return dataclasses.replace(config, **overrides)


def _agent(run_dir: str) -> dict[str, torch.Tensor]:
    return torch.load(find_checkpoint(run_dir), weights_only=False)["agent"]


def _bc_checkpoint(
    tmp_path: Path,
    hidden_sizes: tuple[int, ...],
    num_demos: int = 3,
    length: int = 5,
    epochs: int = 1,
) -> str:
    """A BC checkpoint of InvertedPendulum's shapes (4 obs, 1 action) from synthetic demos."""
    demos = tmp_path / "demos.hdf5"
    _synthetic_demos(demos, obs_dim=4, action_dim=1, num_demos=num_demos, length=length)
    config = BCConfig(
        demos=str(demos),
        output=str(tmp_path / "bc.pt"),
        obs_keys=("obs",),
        hidden_sizes=hidden_sizes,
        max_epochs=epochs,
    )
    return train_bc(config).checkpoint


def test_init_checkpoint_from_bc_then_from_a_run(tmp_path):
    bc_checkpoint = _bc_checkpoint(tmp_path, (64, 64), num_demos=4, length=10, epochs=3)
    actor = torch.load(bc_checkpoint, weights_only=False)["actor"]

    fresh = _agent(train(_tiny(tmp_path, "fresh"))["run_dir"])
    from_bc = _agent(train(_tiny(tmp_path, "from_bc", init_checkpoint=bc_checkpoint))["run_dir"])
    for key in ("actor_mean.0.weight", "actor_mean.4.bias"):
        torch.testing.assert_close(from_bc[key], actor[key])
        assert not torch.equal(fresh[key], actor[key])
    # critic and log std are not in a BC checkpoint: they start as in a fresh run
    torch.testing.assert_close(from_bc["critic.0.weight"], fresh["critic.0.weight"])
    torch.testing.assert_close(from_bc["actor_log_std"], fresh["actor_log_std"])
    # the normaliser started from the demos' statistics and kept counting rollouts
    torch.testing.assert_close(from_bc["obs_rms.count"], actor["obs_rms.count"] + 16)

    # a trainer checkpoint (a run directory) brings the critic and log std too
    donor = _agent(str(tmp_path / "fresh"))
    again = train(_tiny(tmp_path, "from_run", seed=7, init_checkpoint=str(tmp_path / "fresh")))
    loaded = _agent(again["run_dir"])
    for key in ("critic.0.weight", "critic.4.bias", "actor_mean.0.weight", "actor_log_std"):
        torch.testing.assert_close(loaded[key], donor[key])


def test_build_agent_gives_the_std_rl_starts_from_or_keeps_a_trained_one(tmp_path):
    import gymnasium as gym

    from reference_trainer.train import build_agent

    bc_checkpoint = _bc_checkpoint(tmp_path, (64, 64))
    run_dir = train(_tiny(tmp_path, "trained", init_log_std=-1.0))["run_dir"]
    config = _tiny(tmp_path, "eval", init_log_std_per_dim=(-2.0,), explore_dims=(0,))
    env = gym.make("InvertedPendulum-v5")
    spaces = (env.observation_space, env.action_space)
    env.close()
    cpu = torch.device("cpu")

    def log_std(checkpoint, keep):
        agent = build_agent(config, *spaces, cpu, checkpoint, keep_trained_std=keep)
        assert agent.explore_mask is not None and agent.explore_mask.tolist() == [True]
        return agent.actor_log_std.tolist()

    assert log_std(None, False) == [-2.0]
    assert log_std(bc_checkpoint, True) == [-2.0]  # a BC checkpoint has no std of its own
    assert log_std(run_dir, False) == [-2.0]  # RL starts from the config's std
    assert log_std(run_dir, True) == [-1.0]  # evaluation keeps the trained one
    with pytest.raises(ValueError, match="init_log_std_per_dim"):
        build_agent(dataclasses.replace(config, init_log_std_per_dim=(0.0, 0.0)), *spaces, cpu)


def test_init_checkpoint_errors(tmp_path):
    with pytest.raises(ValueError, match="exclusive"):
        train(_tiny(tmp_path, "both", resume=str(tmp_path), init_checkpoint=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(_tiny(tmp_path, "missing", init_checkpoint=str(tmp_path / "nothing.pt")))
    with pytest.raises(ValueError, match=r"hidden sizes \[32\].*--hidden-sizes"):
        train(_tiny(tmp_path, "mismatch", init_checkpoint=_bc_checkpoint(tmp_path, (32,))))
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="neither a BC checkpoint"):
        train(_tiny(tmp_path, "other", init_checkpoint=str(tmp_path / "other.pt")))
