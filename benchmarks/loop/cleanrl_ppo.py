"""A CleanRL-style PPO baseline (after CleanRL's ppo.py), over any vector env with the
Gymnasium API: NumPy observations copied into torch every step, Categorical sampling, actions
read back with .cpu().numpy(), GAE as a Python loop, .item() for logging. The same
hyperparameters as nostall's PPO where they apply; used by bench_ppo.py as the peer.

CleanRL treats a truncated episode as terminated. With bootstrap_truncation the reward of a
truncated step gains gamma * V(final observation), as SB3 and nostall do, so the algorithm can
be held equal to nostall's."""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


class AtariAgent(nn.Module):
    """CleanRL's ppo_atari_envpool.py Agent: the Nature CNN on x / 255, linear heads."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x):
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def train(
    envs,
    args,
    solved_return: float = 475.0,
    max_seconds: float = 600.0,
    bootstrap_truncation: bool = False,
    make_agent=None,
) -> dict:
    """CleanRL's loop. `envs` is a vector env with NEXT-step-free semantics: done envs are
    reset by the env (same-step autoreset, or EnvPool's own autoreset)."""
    torch.manual_seed(args.seed)
    num_envs, num_steps = args.num_envs, args.num_steps
    batch_size = num_envs * num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    obs_shape = tuple(envs.single_observation_space.shape)
    if make_agent is None:  # the MLP on a vector observation
        agent = Agent(obs_shape[0], envs.single_action_space.n)
    else:
        agent = make_agent(obs_shape, envs.single_action_space.n)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    obs = torch.zeros((num_steps, num_envs, *obs_shape))
    actions = torch.zeros((num_steps, num_envs))
    logprobs = torch.zeros((num_steps, num_envs))
    rewards = torch.zeros((num_steps, num_envs))
    dones = torch.zeros((num_steps, num_envs))
    values = torch.zeros((num_steps, num_envs))
    returns_seen: list[float] = []
    episode_return = np.zeros(num_envs)
    global_step, start = 0, time.perf_counter()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs, next_done = torch.Tensor(next_obs), torch.zeros(num_envs)
    solved_at = solved_steps = None
    first_iteration_at = None  # (env steps, seconds) after iteration 1: steady-state from there
    for iteration in range(1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        for step in range(num_steps):
            global_step += num_envs
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            cut = np.flatnonzero(truncations & ~terminations) if bootstrap_truncation else []
            if len(cut):
                # Same-step autoreset keeps the last observation in the info; EnvPool resets
                # on the next call, so its returned observation is still the last one.
                final = infos["final_obs"] if "final_obs" in infos else next_obs
                with torch.no_grad():
                    last = torch.as_tensor(np.stack([final[i] for i in cut]), dtype=torch.float32)
                    rewards[step, cut] += args.gamma * agent.get_value(last).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
            episode_return += reward
            for i in np.flatnonzero(next_done.numpy()):
                returns_seen.append(float(episode_return[i]))
                episode_return[i] = 0.0
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    nextnonterminal, nextvalues = 1.0 - next_done, next_value
                else:
                    nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values
        b_obs, b_logprobs = obs.reshape((-1, *obs_shape)), logprobs.reshape(-1)
        b_actions, b_advantages = actions.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(batch_size)
        shuffler = np.random.default_rng(args.seed + iteration)
        clipfracs = []
        for _ in range(args.update_epochs):
            shuffler.shuffle(b_inds)
            for begin in range(0, batch_size, minibatch_size):
                mb = b_inds[begin : begin + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb], b_actions.long()[mb]
                )
                logratio = newlogprob - b_logprobs[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]
                mb_adv = b_advantages[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                clipped_ratio = torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * clipped_ratio).mean()
                newvalue = newvalue.view(-1)
                v_clipped = b_values[mb] + torch.clamp(
                    newvalue - b_values[mb], -args.clip_coef, args.clip_coef
                )
                v_loss = (
                    0.5
                    * torch.max(
                        (newvalue - b_returns[mb]) ** 2, (v_clipped - b_returns[mb]) ** 2
                    ).mean()
                )
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        if first_iteration_at is None:
            first_iteration_at = (global_step, time.perf_counter() - start)
        recent = returns_seen[-20:]
        if solved_at is None and len(recent) == 20 and np.mean(recent) >= solved_return:
            solved_at = time.perf_counter() - start
            solved_steps = global_step
        if solved_at is not None or time.perf_counter() - start > max_seconds:
            break
    seconds = time.perf_counter() - start
    steps_1, seconds_1 = first_iteration_at
    steady = (global_step - steps_1) / (seconds - seconds_1) if seconds > seconds_1 else 0.0
    return {
        "solved_s": solved_at,
        "solved_steps": solved_steps,
        "steps": global_step,
        "seconds": seconds,
        "steady_sps": steady,
    }
