"""The actor-critic network shared by the trainers, and its sync-free action sampling.

Discrete actions are drawn by Gumbel-max on the device (`Categorical.sample()` takes a
multinomial fast path that reads scalars back: two syncs per sample on CUDA); continuous ones
from a diagonal Gaussian with log-probabilities written out (no distribution validation).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from nostall import _native  # noqa: F401  (loads the native library: env_rollout)
from nostall.envs import _ops  # noqa: F401  (env_rollout's fake kernel and ordered effect)
from nostall.ops.networks import mlp, sample_categorical

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _layer(n_in: int, n_out: int, gain: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, hidden: int = 64):
        super().__init__()
        self.discrete = discrete
        self.critic = nn.Sequential(
            _layer(obs_dim, hidden),
            nn.Tanh(),
            _layer(hidden, hidden),
            nn.Tanh(),
            _layer(hidden, 1, gain=1.0),
        )
        self.actor = nn.Sequential(
            _layer(obs_dim, hidden),
            nn.Tanh(),
            _layer(hidden, hidden),
            nn.Tanh(),
            _layer(hidden, action_dim, gain=0.01),
        )
        self.log_std = nn.Parameter(torch.zeros(action_dim)) if not discrete else None

    @classmethod
    def for_env(cls, env, hidden: int = 64) -> ActorCritic:
        space = env.single_action_space
        discrete = env.info.discrete
        action_dim = int(space.n) if discrete else int(np.prod(space.shape))
        return cls(env.single_observation_space.shape[0], action_dim, discrete, hidden)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return _mlp(self.critic, obs).squeeze(-1)  # (...,)

    def logits_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, value): the two networks' outputs (one call for a shared-torso agent)."""
        return _mlp(self.actor, obs), _mlp(self.critic, obs).squeeze(-1)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's output: logits (discrete) or the Gaussian's mean (continuous)."""
        return _mlp(self.actor, obs)

    def log_prob_entropy(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of `action` and the policy's entropy at `obs`."""
        return log_prob_entropy(_mlp(self.actor, obs), action, self.log_std)


def log_prob_entropy(
    out: torch.Tensor, action: torch.Tensor, log_std: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probability of `action`, entropy) under the actor's output `out`: logits of a
    categorical when log_std is None, else the mean of a diagonal Gaussian."""
    if log_std is None:
        log_p = out.log_softmax(-1)
        chosen = log_p.gather(-1, action[..., None]).squeeze(-1)
        return chosen, -(log_p.exp() * log_p).sum(-1)
    log_std = log_std.expand_as(out)
    z = (action - out) / log_std.exp()
    log_prob = (-0.5 * z.pow(2) - log_std - _LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)
    return log_prob, entropy


def _layers(net: nn.Sequential) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """(weights, biases) of the Linear-Tanh-Linear-Tanh-Linear nets above."""
    first, _, second, _, last = net
    return (first.weight, second.weight, last.weight), (first.bias, second.bias, last.bias)


def _mlp(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """net(x) for the nets above, as one native op (forward and backward): at rollout and
    minibatch sizes, the per-op dispatch of the eager layers costs more than their arithmetic."""
    return mlp(x, *_layers(net))


@torch.no_grad()
def act(
    agent: ActorCritic, obs: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(env_action, action, log_prob, value) for a batch of observations, with no sync."""
    out, value = agent.logits_value(obs)
    if agent.discrete:
        action, log_prob = sample_categorical(out, generator)  # Gumbel-max, one native op
        return action, action, log_prob, value
    std = agent.log_std.exp()
    action = out + std * torch.randn(out.shape, generator=generator)
    z = (action - out) / std
    log_prob = (-0.5 * z.pow(2) - agent.log_std - _LOG_SQRT_2PI).sum(-1)
    return action, action, log_prob, value


@torch.no_grad()
def native_rollout(agent: ActorCritic, env, chunk, generator: torch.Generator) -> None:
    """Fills a rollout chunk (obs[0] set) in one native call (`nostall::env_rollout`): the same
    policy, sampling and steps as `act` and `env.torch.step` one step at a time, with the noise
    for all T steps drawn here first (uniform for Gumbel-max, or standard normal)."""
    T, N = chunk.log_probs.shape
    action_dim = agent.actor[-1].out_features
    draw = torch.rand if agent.discrete else torch.randn
    noise = draw(T, N, action_dim, generator=generator)
    torch.ops.nostall.env_rollout(
        env.handle,
        chunk.obs,
        chunk.actions,
        chunk.log_probs,
        chunk.values,
        chunk.rewards,
        chunk.terminated,
        chunk.truncated,
        chunk.final_obs,
        noise,
        *_layers(agent.actor),
        *_layers(agent.critic),
        agent.log_std,
        "tanh",
    )
