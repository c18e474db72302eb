"""The actor-critic for pixel observations: the Nature CNN (Mnih et al. 2015) as CleanRL's
ppo_atari uses it, a shared convolutional torso with linear policy and value heads.

Frames stay uint8 in the rollout chunks (a quarter of float32's bytes, flattened to [obs_dim])
and are scaled to [0, 1] here, on whatever device the network runs. The interface is
ActorCritic's (value, logits, logits_value, log_prob_entropy), so the trainers, the runtime
and `act` use either without knowing which."""

from __future__ import annotations

import math

import torch
from torch import nn

from nostall.algos.ppo.agent import log_prob_entropy


def _init(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ConvActorCritic(nn.Module):
    def __init__(
        self,
        obs_shape: tuple[int, int, int],
        action_dim: int,
        discrete: bool = True,
        channels_last: bool = False,
    ):
        """obs_shape: one frame stack as the environment gives it, (C, H, W), or (H, W, C) with
        channels_last (Gymnasium's image layout). Frames must be at least 36 pixels a side (the
        torso's receptive field)."""
        super().__init__()
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.channels_last = channels_last
        self.discrete = discrete
        channels, height, width = (
            (self.obs_shape[2], *self.obs_shape[:2]) if channels_last else self.obs_shape
        )
        if min(height, width) < 36:
            raise ValueError(f"the CNN policy needs frames of at least 36x36, got {obs_shape}")
        self.torso = nn.Sequential(
            _init(nn.Conv2d(channels, 32, 8, stride=4)),
            nn.ReLU(),
            _init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            _init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.torso(torch.zeros(1, channels, height, width)).shape[1]
        self.torso.append(_init(nn.Linear(flat, 512)))
        self.torso.append(nn.ReLU())
        self.actor = _init(nn.Linear(512, action_dim), 0.01)
        self.critic = _init(nn.Linear(512, 1), 1.0)
        self.log_std = None if discrete else nn.Parameter(torch.zeros(action_dim))

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        """obs (..., obs_dim) flattened frames, uint8 (or float in [0, 255])."""
        lead = obs.shape[:-1]
        x = obs.reshape(-1, *self.obs_shape)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)  # a channels-last [N, C, H, W] view
        # Channels-last input (copied while still uint8): oneDNN's convolutions run it about
        # 20% faster than channels-first, forward and backward (measured on one CPU thread).
        x = x.contiguous(memory_format=torch.channels_last).float() / 255.0
        return self.torso(x).reshape(*lead, -1)

    def logits_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's output and the critic's value from one pass of the torso."""
        features = self._features(obs)
        return self.actor(features), self.critic(features).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self._features(obs)).squeeze(-1)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(self._features(obs))

    def log_prob_entropy(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return log_prob_entropy(self.logits(obs), action, self.log_std)
