"""The environments nostall provides, with their Gymnasium spaces.

Each native environment matches its Gymnasium 1.x namesake step for step; the spaces below are
Gymnasium's own definitions (checked against Gymnasium in the tests).
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
from gymnasium import spaces

from nostall import _native  # noqa: F401  (loads the native library)


@dataclass(frozen=True)
class EnvInfo:
    id: str
    observation_space: spaces.Box
    action_space: spaces.Space
    max_episode_steps: int
    state_dim: int
    reward_threshold: float | None = None

    @property
    def discrete(self) -> bool:
        return isinstance(self.action_space, spaces.Discrete)


def _box(high, low=None) -> spaces.Box:
    high = np.array(high, dtype=np.float32)
    low = -high if low is None else np.array(low, dtype=np.float32)
    return spaces.Box(low, high, dtype=np.float32)


_THETA = 12 * 2 * math.pi / 360
_ENVS = [
    EnvInfo(
        "CartPole-v1",
        _box([2.4 * 2, np.inf, _THETA * 2, np.inf]),
        spaces.Discrete(2),
        500,
        4,
        475.0,
    ),
    EnvInfo(
        "Pendulum-v1",
        _box([1.0, 1.0, 8.0]),
        spaces.Box(-2.0, 2.0, shape=(1,), dtype=np.float32),
        200,
        2,
    ),
    EnvInfo(
        "Acrobot-v1",
        _box([1.0, 1.0, 1.0, 1.0, 4 * math.pi, 9 * math.pi]),
        spaces.Discrete(3),
        500,
        4,
        -100.0,
    ),
    EnvInfo("MountainCar-v0", _box([0.6, 0.07], [-1.2, -0.07]), spaces.Discrete(3), 200, 2, -110.0),
    EnvInfo(
        "MountainCarContinuous-v0",
        _box([0.6, 0.07], [-1.2, -0.07]),
        spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32),
        999,
        3,
        90.0,
    ),
]
ENVS: dict[str, EnvInfo] = {e.id: e for e in _ENVS}


def env_info(env_id: str) -> EnvInfo:
    """The description of `env_id`; ValueError naming the known ids for an unknown one."""
    if env_id not in ENVS:
        raise ValueError(f"unknown environment id {env_id!r}; known ids: {', '.join(ENVS)}")
    info = ENVS[env_id]
    obs_dim, state_dim, discrete, _, _, max_steps = torch.ops.nostall.env_describe(env_id)
    if (obs_dim, state_dim, bool(discrete), max_steps) != (
        info.observation_space.shape[0],
        info.state_dim,
        info.discrete,
        info.max_episode_steps,
    ):
        raise RuntimeError(f"native and Python descriptions of {env_id} disagree")
    return info
