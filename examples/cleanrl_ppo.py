"""A CleanRL-style PPO on Gymnasium's CartPole-v1, as most users write one (CleanRL's
ppo.py: a Gymnasium vector env, `Categorical` sampling, `action.cpu().numpy()` every step, GAE
in a Python loop, minibatch epochs). Unchanged by nostall: it is what `nostall profile` is
pointed at.

    python examples/cleanrl_ppo.py [--iterations 4] [--num-steps 128] [--device cpu]
    nostall profile examples/cleanrl_ppo.py -- --iterations 2
    python examples/cleanrl_ppo.py --trace trace.json && nostall trace trace.json --plot bound.png

The profile lists its sync sites (on a GPU each one stalls the loop); `--trace` records a
torch.profiler trace of the loop (with Python stacks, so environment steps can be told apart),
from which `nostall trace` says what the loop is bound by (environment step, policy inference,
update, transfers, waiting).
"""

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical

NUM_ENVS, EPOCHS, MINIBATCHES = 4, 4, 4
GAMMA, LAMBDA, CLIP, ENT, VF, LR = 0.99, 0.95, 0.2, 0.01, 0.5, 2.5e-4


class Agent(nn.Module):
    def __init__(self, obs_dim: int, actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
        )
        self.actor = nn.Sequential(
            nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, actions)
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def main(iterations: int, device: torch.device, num_steps: int = 128) -> float:
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(NUM_ENVS)])
    agent = Agent(4, 2).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=LR, eps=1e-5)
    obs_buf = torch.zeros((num_steps, NUM_ENVS, 4), device=device)
    actions = torch.zeros((num_steps, NUM_ENVS), device=device)
    logprobs = torch.zeros((num_steps, NUM_ENVS), device=device)
    rewards = torch.zeros((num_steps, NUM_ENVS), device=device)
    dones = torch.zeros((num_steps, NUM_ENVS), device=device)
    values = torch.zeros((num_steps, NUM_ENVS), device=device)
    next_obs, _ = envs.reset(seed=1)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(NUM_ENVS, device=device)
    loss = torch.zeros((), device=device)
    for _ in range(iterations):
        for step in range(num_steps):
            obs_buf[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, logprob
            next_obs, reward, terminations, truncations, _ = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs = torch.Tensor(next_obs).to(device)
            next_done = torch.Tensor(next_done).to(device)
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(num_steps)):
                nonterminal = 1.0 - (next_done if t == num_steps - 1 else dones[t + 1])
                nextvalues = next_value if t == num_steps - 1 else values[t + 1]
                delta = rewards[t] + GAMMA * nextvalues * nonterminal - values[t]
                advantages[t] = lastgaelam = delta + GAMMA * LAMBDA * nonterminal * lastgaelam
            returns = advantages + values
        b_obs, b_actions = obs_buf.reshape(-1, 4), actions.reshape(-1)
        b_logprobs, b_adv = logprobs.reshape(-1), advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        batch = NUM_ENVS * num_steps
        for _ in range(EPOCHS):
            order = rng.permutation(batch)
            for start in range(0, batch, batch // MINIBATCHES):
                mb = order[start : start + batch // MINIBATCHES]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb], b_actions.long()[mb]
                )
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg_loss = torch.max(
                    -mb_adv * ratio, -mb_adv * ratio.clamp(1 - CLIP, 1 + CLIP)
                ).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb]) ** 2).mean()
                loss = pg_loss - ENT * entropy.mean() + VF * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
    envs.close()
    return loss.item()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--trace", help="record a torch.profiler trace of the run there")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.trace:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities, with_stack=True) as prof:
            loss = main(args.iterations, device, args.num_steps)
        prof.export_chrome_trace(args.trace)
    else:
        loss = main(args.iterations, device, args.num_steps)
    print(f"final loss {loss:.4f}")
