"""Frame stacking for Gymnasium image environments, as Atari agents see frames (DQN's four
stacked frames; EnvPool's `stack_num`): the last k frames as one observation, stacked along
the channel axis so the CNN takes the stack as channels.

    [H, W] grayscale      -> [k, H, W]
    [C, H, W]             -> [k * C, H, W]
    [H, W, C] (Gymnasium) -> [H, W, k * C]  (channels last, as the env draws them)

A reset fills the stack with copies of the first frame (Gymnasium's FrameStackObservation with
padding_type="reset"). The wrapper is per environment, so with same-step autoreset the final
observation of an episode is its own full stack, and a checkpoint holds the stack (an array)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image's channels are its last axis ([H, W, C], Gymnasium's layout, stacked
    or not): the last axis smaller than both others. [C, H, W] (EnvPool's) otherwise."""
    return len(shape) == 3 and shape[-1] < min(shape[0], shape[1])


def channel_axis(shape: tuple[int, ...]) -> int:
    """The axis frames stack along."""
    return -1 if channels_last(shape) else 0


class StackFrames(gym.Wrapper):
    def __init__(self, env: gym.Env, k: int):
        super().__init__(env)
        space = env.observation_space
        if k < 1:
            raise ValueError(f"frame_stack must be at least 1, got {k}")
        if not (
            isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) in (2, 3)
        ):
            raise ValueError(
                f"frame stacking takes uint8 image observations ([H, W], [C, H, W] or "
                f"[H, W, C]); this environment observes {space}"
            )
        self.k = k
        self._grayscale = len(space.shape) == 2
        self._axis = 0 if self._grayscale else channel_axis(space.shape)
        low, high = self._frame(space.low), self._frame(space.high)
        self.observation_space = spaces.Box(
            np.concatenate([low] * k, axis=self._axis),
            np.concatenate([high] * k, axis=self._axis),
            dtype=np.uint8,
        )
        self._frames: list[np.ndarray] = []

    def _frame(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs, dtype=np.uint8)
        return obs[None] if self._grayscale else obs

    def _stack(self) -> np.ndarray:
        return np.concatenate(self._frames, axis=self._axis)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._frames = [self._frame(obs)] * self.k
        return self._stack(), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._frames = [*self._frames[1:], self._frame(obs)]
        return self._stack(), reward, terminated, truncated, info
