"""The actor-critic a PPO / APPO run trains, chosen for the environment's observations: the MLP
(agent.py) for a vector, the Nature CNN (conv_agent.py) for uint8 images."""

from __future__ import annotations

import numpy as np
import torch

from nostall.algos.ppo.agent import ActorCritic
from nostall.algos.ppo.conv_agent import ConvActorCritic
from nostall.envs.frame_stack import channels_last

POLICIES = ("auto", "mlp", "cnn")


def make_agent(env, hidden: int = 64, policy: str = "auto") -> torch.nn.Module:
    """The actor-critic for `env`'s spaces: the MLP for a 1-D observation vector, the Nature
    CNN (conv_agent.py) for uint8 image observations ([C, H, W], or [H, W, C]); `policy`
    overrides the choice. ValueError saying which observations each policy takes."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    space = env.single_observation_space
    pixels = len(space.shape) == 3 and space.dtype == np.uint8
    kind = ("cnn" if pixels else "mlp") if policy == "auto" else policy
    if kind == "cnn":
        if not pixels:
            raise ValueError(
                f"{env.info.id}: the cnn policy takes uint8 image observations [C, H, W] or "
                f"[H, W, C]; this environment's are {space}"
            )
        last = channels_last(space.shape)
        action_space = env.single_action_space
        discrete = env.info.discrete
        action_dim = int(action_space.n) if discrete else int(np.prod(action_space.shape))
        return ConvActorCritic(space.shape, action_dim, discrete, last)
    if len(space.shape) != 1:
        raise ValueError(
            f"{env.info.id}: the mlp policy takes a 1-D observation vector; this environment's "
            f"observations are {space}" + (" (use --policy cnn)" if pixels else "")
        )
    return ActorCritic.for_env(env, hidden)
