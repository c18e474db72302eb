"""The storage a vector env's rollouts need: the sizes and dtypes of its chunks' rows."""

from __future__ import annotations

import math

import numpy as np
import torch


def slot_layout(env) -> dict:
    """The chunk sizes a vector env's rollouts need (keyword arguments of rollout_slots)."""
    discrete = env.info.discrete
    space = env.single_observation_space
    return {
        "num_envs": env.num_envs,
        "obs_dim": int(math.prod(space.shape)),  # pixels are stored flattened
        "action_shape": () if discrete else tuple(env.single_action_space.shape),
        "discrete": discrete,
        "obs_dtype": torch.uint8 if space.dtype == np.uint8 else torch.float32,
    }
