"""PPO for continuous actions in one file, in CleanRL's style, on a PipelinedVectorEnv.

The script is written as a plain ``gymnasium.vector.SyncVectorEnv`` script would be; the
line marked ``# <- the one line`` is the only one that changes to switch vector envs.

It is correct under gymnasium 1.x's default NEXT_STEP autoreset:
- episode statistics come from ``infos["episode"]`` / ``infos["_episode"]`` of the step
  that ends the episode (``RecordEpisodeStatistics`` inside each env);
- the step after an episode end only resets its env (reward 0, action ignored): it is
  kept out of the loss and cuts the advantage recursion;
- a truncated episode bootstraps from the value of its final observation, which NEXT_STEP
  returns as the next observation.

With ``--num-stages`` above 1 the envs are split into stages and the rollout loop overlaps
them: while one stage's simulators step in their worker processes, the policy infers
actions for another stage::

    for step ...:
        for stage s:
            results of s <- envs.step_wait(stage=s)      # the other stages keep stepping
            actions of s <- policy(observations of s)     # inference overlaps their steps
            envs.step_async(actions of s, stage=s)

Per-stage calls bypass gymnasium's vector wrappers, so episode statistics come from
``RecordEpisodeStatistics`` inside each env (``infos["episode"]`` of each stage's step),
mapped to global env indices with ``envs.stage_slices``. With one stage (the default) the
rollout is the plain ``envs.step`` loop.

Run:
    python examples/cleanrl_ppo_continuous_action.py --env-id HalfCheetah-v5
    python examples/cleanrl_ppo_continuous_action.py --env-id HalfCheetah-v5 --num-stages 2
    python examples/cleanrl_ppo_continuous_action.py --env-id Pendulum-v1 --total-timesteps 2048
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions.normal import Normal

from pipelined_vec_env import PipelinedVectorEnv


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__).removesuffix(".py")
    """name of the experiment (used in the run name)"""
    seed: int = 1
    """seed of python, numpy, torch and the envs"""
    torch_deterministic: bool = True
    """set `torch.backends.cudnn.deterministic`"""
    cuda: bool = False
    """run the agent on CUDA if available"""
    torch_threads: int = 1
    """torch CPU threads for the agent (the env workers have their own cores)"""
    tensorboard_dir: str | None = None
    """write TensorBoard scalars under this folder (off when None)"""
    episode_log: str | None = None
    """write every logged episode (and RecordEpisodeStatistics' own record) to this JSON file"""

    env_id: str = "HalfCheetah-v5"
    """gymnasium id of the environment"""
    max_episode_steps: int | None = None
    """episode step limit (None: the env's registered default)"""
    total_timesteps: int = 1_000_000
    """total env steps over all envs"""
    learning_rate: float = 3e-4
    """Adam learning rate"""
    num_envs: int = 4
    """number of parallel envs"""
    num_steps: int = 512
    """steps per env per rollout"""
    num_stages: int = 1
    """pipeline stages the envs are split into (1: the plain `envs.step` rollout, no overlap)"""
    anneal_lr: bool = True
    """decay the learning rate linearly to zero"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of generalized advantage estimation"""
    num_minibatches: int = 32
    """minibatches per epoch"""
    update_epochs: int = 10
    """epochs over each rollout"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss as well"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """gradient norm clip"""
    target_kl: float | None = None
    """stop the epochs of an update early above this approximate KL"""


def make_env(env_id: str, gamma: float, max_episode_steps: int | None):
    """Return a constructor of one wrapped env (called inside a worker process)."""

    def thunk() -> gym.Env:
        env = gym.make(env_id, max_episode_steps=max_episode_steps)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)  # raw returns, before normalisation
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(
            env, lambda obs: np.clip(obs, -10, 10), env.observation_space
        )
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda r: float(np.clip(r, -10, 10)))
        return env

    return thunk


def orthogonal(layer: nn.Linear, gain: float = np.sqrt(2)) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Agent(nn.Module):
    """Separate tanh MLPs for the value and the Gaussian policy mean; state-free log std."""

    def __init__(self, obs_dim: int, act_dim: int) -> None:
        super().__init__()

        def mlp(out: int, gain: float) -> nn.Sequential:
            return nn.Sequential(
                orthogonal(nn.Linear(obs_dim, 64)),
                nn.Tanh(),
                orthogonal(nn.Linear(64, 64)),
                nn.Tanh(),
                orthogonal(nn.Linear(64, out), gain),
            )

        self.critic = mlp(1, 1.0)
        self.actor_mean = mlp(act_dim, 0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def policy(self, obs: torch.Tensor) -> Normal:
        mean = self.actor_mean(obs)
        return Normal(mean, self.actor_logstd.expand_as(mean).exp())

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions; return them with their log-probabilities and the values."""
        dist = self.policy(obs)
        action = dist.sample()
        return action, dist.log_prob(action).sum(-1), self.value(obs)


def main(args: Args) -> dict:
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = max(1, args.total_timesteps // batch_size)
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    writer = None
    if args.tensorboard_dir is not None:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.path.join(args.tensorboard_dir, run_name))

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    env_fns = [
        make_env(args.env_id, args.gamma, args.max_episode_steps) for _ in range(args.num_envs)
    ]
    # with SyncVectorEnv this line reads: envs = gym.vector.SyncVectorEnv(env_fns)
    envs = PipelinedVectorEnv(env_fns, num_stages=args.num_stages)  # <- the one line
    assert isinstance(envs.single_action_space, gym.spaces.Box), "continuous actions only"
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))

    agent = Agent(obs_dim, act_dim).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    shape = (args.num_steps, args.num_envs)
    obs = torch.zeros(shape + (obs_dim,), device=device)
    actions = torch.zeros(shape + (act_dim,), device=device)
    logprobs = torch.zeros(shape, device=device)
    values = torch.zeros(shape, device=device)
    rewards = torch.zeros(shape, device=device)
    terminated = torch.zeros(shape, device=device)
    ended = torch.zeros(shape, device=device)  # terminated or truncated
    valid = torch.zeros(shape, dtype=torch.bool, device=device)  # not a reset-only step

    episodes: list[dict] = []
    global_step = 0
    start_time = time.time()
    next_obs_np, _ = envs.reset(seed=args.seed)
    next_obs = torch.tensor(next_obs_np, dtype=torch.float32, device=device)  # a copy: set in place
    resetting = np.zeros(args.num_envs, dtype=bool)  # envs whose next step only resets them

    for iteration in range(1, num_iterations + 1):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.learning_rate * (
                1.0 - (iteration - 1.0) / num_iterations
            )

        # ---- rollout ---------------------------------------------------------------
        def infer(step: int, envs_of_s: slice) -> np.ndarray:
            """Store the observations of envs ``envs_of_s`` at ``step``; choose their actions."""
            obs[step, envs_of_s] = next_obs[envs_of_s]
            valid[step, envs_of_s] = torch.as_tensor(~resetting[envs_of_s], device=device)
            with torch.no_grad():
                action, logprob, value = agent.act(next_obs[envs_of_s])
            actions[step, envs_of_s], logprobs[step, envs_of_s] = action, logprob
            values[step, envs_of_s] = value
            return action.cpu().numpy()

        def record(step: int, envs_of_s: slice, obs_s, reward, term, trunc, infos) -> None:
            """Store the step results of envs ``envs_of_s``; log the episodes that ended."""
            nonlocal global_step
            global_step += envs_of_s.stop - envs_of_s.start
            next_obs[envs_of_s] = torch.as_tensor(obs_s, dtype=torch.float32, device=device)
            rewards[step, envs_of_s] = torch.as_tensor(reward, dtype=torch.float32, device=device)
            terminated[step, envs_of_s] = torch.as_tensor(term, dtype=torch.float32, device=device)
            ended[step, envs_of_s] = torch.as_tensor(
                term | trunc, dtype=torch.float32, device=device
            )
            resetting[envs_of_s] = term | trunc

            if "episode" in infos:
                for local in np.flatnonzero(infos["_episode"]):
                    i = envs_of_s.start + int(local)
                    episode = {
                        "global_step": global_step,
                        "env": i,
                        "return": float(infos["episode"]["r"][local]),
                        "length": int(infos["episode"]["l"][local]),
                    }
                    episodes.append(episode)
                    print(
                        f"global_step={global_step}, env={i}, episodic_return={episode['return']:.2f}"
                    )
                    if writer is not None:
                        writer.add_scalar("charts/episodic_return", episode["return"], global_step)
                        writer.add_scalar("charts/episodic_length", episode["length"], global_step)

        if args.num_stages == 1:
            all_envs = slice(0, args.num_envs)
            for step in range(args.num_steps):
                action = infer(step, all_envs)
                record(step, all_envs, *envs.step(action))
        else:  # staged: while one stage's simulators step, the policy infers another's actions
            for s, envs_of_s in enumerate(envs.stage_slices):  # prime: every stage in flight
                envs.step_async(infer(0, envs_of_s), stage=s)
            for step in range(args.num_steps):
                for s, envs_of_s in enumerate(envs.stage_slices):
                    record(step, envs_of_s, *envs.step_wait(stage=s))  # stage s only
                    if step + 1 < args.num_steps:
                        envs.step_async(infer(step + 1, envs_of_s), stage=s)

        # ---- advantages (GAE) ------------------------------------------------------
        with torch.no_grad():
            next_value = agent.value(next_obs)
            advantages = torch.zeros_like(rewards)
            running = torch.zeros(args.num_envs, device=device)
            for t in reversed(range(args.num_steps)):
                following = next_value if t == args.num_steps - 1 else values[t + 1]
                delta = rewards[t] + args.gamma * following * (1.0 - terminated[t]) - values[t]
                running = delta + args.gamma * args.gae_lambda * (1.0 - ended[t]) * running
                advantages[t] = running
            returns = advantages + values

        # ---- update ----------------------------------------------------------------
        keep = valid.reshape(-1)
        b_obs = obs.reshape(-1, obs_dim)[keep]
        b_actions = actions.reshape(-1, act_dim)[keep]
        b_logprobs = logprobs.reshape(-1)[keep]
        b_advantages = advantages.reshape(-1)[keep]
        b_returns = returns.reshape(-1)[keep]
        b_values = values.reshape(-1)[keep]
        n_samples = b_obs.shape[0]
        num_minibatches = max(1, n_samples // max(1, minibatch_size))
        clipfracs = []
        for _ in range(args.update_epochs):
            order = np.random.permutation(n_samples)
            for mb in np.array_split(order, num_minibatches):
                dist = agent.policy(b_obs[mb])
                newlogprob = dist.log_prob(b_actions[mb]).sum(-1)
                entropy = dist.entropy().sum(-1)
                newvalue = agent.value(b_obs[mb])
                logratio = newlogprob - b_logprobs[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())

                mb_adv = b_advantages[mb]
                if args.norm_adv and len(mb) > 1:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(
                    -mb_adv * ratio,
                    -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef),
                ).mean()

                if args.clip_vloss:
                    v_unclipped = (newvalue - b_returns[mb]) ** 2
                    v_clipped = b_values[mb] + torch.clamp(
                        newvalue - b_values[mb], -args.clip_coef, args.clip_coef
                    )
                    v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb]) ** 2).mean()

                loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        # ---- logging ---------------------------------------------------------------
        sps = int(global_step / (time.time() - start_time))
        print(f"iteration={iteration}/{num_iterations} SPS={sps}")
        if writer is not None:
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy.mean().item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            writer.add_scalar("losses/clipfrac", float(np.mean(clipfracs)), global_step)
            writer.add_scalar("charts/SPS", sps, global_step)

    if not episodes:
        print(
            f"no episode finished within {global_step} env steps, so no episodic_return was "
            f"logged: raise --total-timesteps (episodes of {args.env_id} can last 1000 steps "
            "per env) or try a short-episode env such as Pendulum-v1"
        )
    result = {
        "episodes": episodes,
        # what RecordEpisodeStatistics itself recorded, per env, to check the logging above
        "recorded_returns": [[float(r) for r in q] for q in envs.get_attr("return_queue")],
        "recorded_lengths": [[int(n) for n in q] for q in envs.get_attr("length_queue")],
    }
    if args.episode_log is not None:
        with open(args.episode_log, "w") as f:
            json.dump(result, f)
    envs.close()
    if writer is not None:
        writer.close()
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
