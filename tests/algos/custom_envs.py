"""Small Gymnasium environments defined outside nostall, for `--env module:EnvClass`."""

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class SignEnv(gym.Env):
    """Observe a number in [-1, 1]; reward 1 for action 1 when it is positive, action 0 when it
    is not. Ten steps an episode: random play earns about 5, a learned policy 10."""

    observation_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.x = self.np_random.uniform(-1, 1, size=1).astype(np.float32)
        return self.x.copy(), {}

    def step(self, action):
        reward = float(int(action) == int(self.x[0] > 0))
        self.t += 1
        self.x = self.np_random.uniform(-1, 1, size=1).astype(np.float32)
        return self.x.copy(), reward, False, self.t >= 10, {}


class FailingEnv(SignEnv):
    """SignEnv that raises on its 300th step: a user's bug surfacing mid-run."""

    steps = 0

    def step(self, action):
        FailingEnv.steps += 1
        if FailingEnv.steps == 300:
            raise RuntimeError("FailingEnv: the simulator diverged")
        return super().step(action)


class DictActionEnv(SignEnv):
    action_space = spaces.MultiDiscrete([2, 3])


class VisualSignEnv(SignEnv):
    """SignEnv seen as a 40x40 RGB image, channels last as Gymnasium draws images: the left
    half lit when the hidden number is positive, the right half when it is not."""

    observation_space = spaces.Box(0, 255, shape=(40, 40, 3), dtype=np.uint8)
    metadata = {"render_modes": ("rgb_array",)}  # noqa: RUF012 (Gymnasium's attribute)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def render(self):
        return VisualSignEnv._frame(self)

    def _frame(self) -> np.ndarray:
        frame = np.zeros((40, 40, 3), dtype=np.uint8)
        if self.x[0] > 0:
            frame[:, :20] = 255
        else:
            frame[:, 20:] = 255
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return self._frame(), reward, terminated, truncated, info


class GraySignEnv(VisualSignEnv):
    """VisualSignEnv in grayscale, [H, W] as Atari preprocessing gives frames."""

    observation_space = spaces.Box(0, 255, shape=(40, 40), dtype=np.uint8)

    def _frame(self) -> np.ndarray:
        return super()._frame()[..., 0].copy()
