"""Self-imitation: the success buffer cuts rollouts into per-env episodes (across rollout
boundaries) and keeps the successful ones; its update regresses only the actor's mean;
the trainer drives it end to end and a resumed run keeps the buffer."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from reference_trainer.agent import ActorCritic
from reference_trainer.checkpoint import find_checkpoint
from reference_trainer.metrics import EpisodeRecord
from reference_trainer.rollout import Rollout
from reference_trainer.self_imitation import SuccessBuffer, self_imitation_update, sign_dims_mask
from reference_trainer.train import train

from .test_finetune import ReachFactory, _config

pytestmark = pytest.mark.timeout(120)

N = 2


def _rollout(start: int, T: int, ends: list[tuple[int, int, bool]]) -> Rollout:
    """Observation of env ``i`` at global decision ``g`` is ``100 * i + g``; the action is
    its negative. ``ends``: ``(env, decision_index, success)``."""
    g = torch.arange(start, start + T, dtype=torch.float32)[:, None]
    obs = (g + 100 * torch.arange(N)[None, :]).unsqueeze(-1)  # (T, N, 1)
    zeros = torch.zeros(T, N)
    return Rollout(
        obs=obs,
        actions=-obs.clone(),
        logprobs=zeros,
        values=zeros,
        rewards=np.zeros((T, N)),
        terminated=np.zeros((T, N), bool),
        truncated=np.zeros((T, N), bool),
        final_values=zeros,
        next_value=torch.zeros(N),
        episodes=[EpisodeRecord(e, t, 0.0, 1, s, s) for e, t, s in ends],
    )


def _decisions(buffer: SuccessBuffer) -> set[float]:
    obs, actions = buffer.sample(500, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert torch.equal(actions, -obs)  # each observation comes with its own action
    return set(obs.reshape(-1).tolist())


def test_buffer_keeps_successful_episodes_whole_across_rollouts():
    buffer = SuccessBuffer(N, capacity=1000)
    # env 0: decisions 0-1 succeed, 2-4 fail; env 1: an episode that runs on
    assert buffer.add(_rollout(0, 5, [(0, 1, True), (0, 4, False)])) == 1
    assert _decisions(buffer) == {0.0, 1.0}
    # env 1's episode (decisions 0-7) ends in success in the second rollout
    assert buffer.add(_rollout(5, 5, [(1, 2, True)])) == 1
    assert _decisions(buffer) == {0.0, 1.0, *(100.0 + g for g in range(8))}
    assert (buffer.num_episodes, len(buffer)) == (2, 10)


def test_discard_pending_forgets_the_episodes_in_progress():
    buffer = SuccessBuffer(N, capacity=1000)
    buffer.add(_rollout(0, 4, []))
    buffer.discard_pending()
    buffer.add(_rollout(4, 4, [(1, 1, True)]))
    assert _decisions(buffer) == {104.0, 105.0}


def test_capacity_drops_the_oldest_episodes():
    buffer = SuccessBuffer(N, capacity=5)
    buffer.add(_rollout(0, 4, [(0, 2, True)]))  # 3 decisions
    buffer.add(_rollout(4, 4, [(0, 2, True)]))  # 4 decisions (decision 3 pending, then 4-6)
    assert (buffer.num_episodes, len(buffer)) == (1, 4)
    assert _decisions(buffer) == {3.0, 4.0, 5.0, 6.0}
    with pytest.raises(ValueError, match="capacity"):
        SuccessBuffer(N, capacity=0)


def test_per_env_buffer_draws_every_env_equally_and_drops_per_env():
    buffer = SuccessBuffer(N, capacity=20, per_env=True)
    # env 0: five 2-decision successes (10 decisions, its share); env 1: one of 2
    ends = [(0, t, True) for t in (1, 3, 5, 7, 9)] + [(1, 1, True)]
    assert buffer.add(_rollout(0, 10, ends)) == 6
    obs, _ = buffer.sample(4000, torch.Generator().manual_seed(0), torch.device("cpu"))
    from_env_1 = float((obs >= 100).float().mean())
    assert 0.45 < from_env_1 < 0.55  # a uniform draw would give 2 / 12
    # env 0 goes over its 10 decisions: its own oldest episode goes, env 1 keeps its one
    buffer.add(_rollout(10, 2, [(0, 1, True)]))
    assert (buffer.num_episodes, len(buffer)) == (6, 12)
    assert _decisions(buffer) == {*(float(g) for g in range(2, 12)), 100.0, 101.0}
    restored = SuccessBuffer(N, capacity=20, per_env=True)
    restored.load_state_dict(buffer.state_dict())
    assert restored.num_episodes == 6 and _decisions(restored) == _decisions(buffer)
    with pytest.raises(ValueError, match="num_envs"):
        SuccessBuffer(N, capacity=1, per_env=True)


def test_empty_buffer_sampling_says_so():
    with pytest.raises(ValueError, match="empty"):
        SuccessBuffer(N, 10).sample(4, torch.Generator(), torch.device("cpu"))


def test_update_moves_the_actor_mean_to_the_successful_actions_only():
    torch.manual_seed(0)
    space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    agent = ActorCritic(space, gym.spaces.Box(-200.0, 200.0, (1,), np.float32), (16,), -1.0)
    buffer = SuccessBuffer(N, 1000)
    rollout = _rollout(0, 6, [(0, 5, True)])
    rollout.obs = rollout.obs / 10.0  # inside the normaliser's comfortable range
    rollout.actions = 0.5 - rollout.obs  # a simple map to learn
    buffer.add(rollout)
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    optimizer = torch.optim.Adam(agent.actor_mean.parameters(), lr=1e-2)
    first = self_imitation_update(
        agent, optimizer, buffer, steps=1, batch_size=64, generator=torch.Generator()
    )
    last = self_imitation_update(
        agent, optimizer, buffer, steps=300, batch_size=64, generator=torch.Generator()
    )
    assert first.loss is not None and last.loss is not None
    assert last.loss < 0.1 * first.loss
    after = agent.state_dict()
    for key in before:
        moved = not torch.equal(before[key], after[key])
        assert moved == key.startswith("actor_mean."), key
    empty = self_imitation_update(
        agent, optimizer, SuccessBuffer(N, 10), steps=5, batch_size=4, generator=torch.Generator()
    )
    assert empty.loss is None and empty.steps == 0


def test_sign_dims_regress_onto_the_sign_of_the_action_taken():
    """A gripper-like dimension whose successful actions were small and of both signs,
    mostly positive: with its sign as the target the mean goes to the majority's +1 side
    (past the threshold at 0, decisively); with the raw values it stays near their small
    average. The other dimension regresses onto its values either way."""
    torch.manual_seed(0)
    space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    buffer = SuccessBuffer(N, 1000)
    rollout = _rollout(0, 40, [(0, 39, True)])
    rollout.obs = torch.zeros_like(rollout.obs)  # one state
    taken = torch.where(torch.arange(40) % 4 == 0, -0.3, 0.1)  # 30 of 40 close, barely
    rollout.actions = torch.stack([torch.full((40,), 0.5), taken], -1)[:, None].repeat(1, N, 1)
    buffer.add(rollout)
    means = {}
    for dims in ((), (1,)):
        agent = ActorCritic(space, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), (16,), -1.0)
        optimizer = torch.optim.Adam(agent.actor_mean.parameters(), lr=1e-2)
        self_imitation_update(
            agent,
            optimizer,
            buffer,
            steps=300,
            batch_size=64,
            generator=torch.Generator().manual_seed(1),
            sign_mask=sign_dims_mask((2,), dims),
        )
        with torch.no_grad():
            means[dims] = agent.distribution(torch.zeros(1, 1))[0][0].tolist()
    assert means[()][0] == pytest.approx(0.5, abs=0.05) == means[(1,)][0]
    assert means[()][1] == pytest.approx(0.0, abs=0.05)  # the raw values' average
    assert means[(1,)][1] == pytest.approx(0.5, abs=0.05)  # the signs' average: 30 - 10 of 40
    assert sign_dims_mask((3, 2), [1]).tolist() == [0.0, 1.0] * 3  # over an action chunk
    assert sign_dims_mask((7,), []) is None
    with pytest.raises(ValueError, match="self_imitation_sign_dims"):
        sign_dims_mask((7,), [7])


@pytest.mark.parametrize("per_env", [False, True])
def test_trainer_imitates_its_successes_and_a_resumed_run_keeps_them(tmp_path, per_env):
    config = _config(
        tmp_path,
        "sil",
        self_imitation_per_env=per_env,
        total_timesteps=160,
        num_steps=16,
        self_imitation_steps=3,
        self_imitation_batch_size=8,
        checkpoint_every=1,
        eval_episodes=0,
    )
    summary = train(config, ReachFactory())
    state = torch.load(find_checkpoint(summary["run_dir"]), weights_only=False)
    buffer = state["self_imitation"]["buffer"]
    # ReachEnv's random start policy reaches the goal in some episodes of 80 decisions
    assert buffer["episodes"], "no successful episode in 80 decisions"
    assert buffer["per_env"] is per_env
    # the summary counts every training episode once, per env and half of the run
    per_env = summary["train_success_per_env"]
    counted = sum(sum(per_env[h]["episodes"]) for h in ("first_half", "second_half"))
    assert counted == sum(h["episode/episodes"] for h in state["history"])
    assert all(len(per_env[h]["success_rate"]) == config.num_envs for h in per_env)
    history = state["history"]
    imitated = [h for h in history if "self_imitation/loss" in h]
    assert imitated and all(h["self_imitation/steps"] == 3 for h in imitated)
    kept = len(buffer["episodes"])
    resumed = dataclasses.replace(config, resume=summary["run_dir"], total_timesteps=192)
    train(resumed, ReachFactory())
    state = torch.load(find_checkpoint(summary["run_dir"]), weights_only=False)
    assert len(state["self_imitation"]["buffer"]["episodes"]) >= kept
    assert state["history"][-1]["self_imitation/episodes"] >= kept
