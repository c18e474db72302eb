"""Any Gymnasium environment behind the interface nostall's runtime steps: a registered id
(`LunarLander-v3`) or a class (`my_module:MyEnv`), vectorised with Gymnasium's SyncVectorEnv and
same-step autoreset, written into the rollout's preallocated rows as a native env writes them.

The native environments stay the fast path (`nostall.envs.make`); `make_env` picks one or the
other by id. The rollout side steps this adapter from Python, one call per step; the trainer's
side is unchanged."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from nostall.envs.env_state import EnvStateError, env_state, load_env_state
from nostall.envs.frame_stack import StackFrames
from nostall.envs.layout import slot_layout
from nostall.envs.registry import ENVS
from nostall.envs.vector import EnvStep
from nostall.user_code import import_user_module


@dataclass(frozen=True)
class AdapterInfo:
    """What the trainers read of an environment (the native EnvInfo's fields)."""

    id: str
    observation_space: spaces.Box
    action_space: spaces.Space
    max_episode_steps: int | None
    reward_threshold: float | None

    @property
    def discrete(self) -> bool:
        return isinstance(self.action_space, spaces.Discrete)


def _env_factory(env_id: str) -> Callable[[], gym.Env]:
    """A picklable-by-reference maker of one environment for `env_id`; ValueError with the
    close matches for an id Gymnasium does not know."""
    if ":" in env_id and env_id not in gym.registry:
        module_name, _, class_name = env_id.partition(":")
        try:
            module = import_user_module(module_name)
        except ImportError as e:
            raise ValueError(f"environment {env_id!r}: cannot import {module_name!r} ({e})") from e
        env_class = getattr(module, class_name, None)
        if env_class is None:
            raise ValueError(f"environment {env_id!r}: {module_name} has no {class_name!r}")
        return env_class
    if env_id not in gym.registry:
        known = list(ENVS) + list(gym.registry)
        close = difflib.get_close_matches(env_id, known, n=5, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ValueError(
            f"unknown environment {env_id!r}: not one of nostall's native environments and not "
            f"registered with Gymnasium (or 'module:EnvClass'){hint}"
        )
    return lambda: gym.make(env_id)


def make_one(env_id: str, frame_stack: int = 0) -> Callable[..., gym.Env]:
    """A maker of one environment for `env_id` (keyword arguments go to the environment, e.g.
    render_mode), its frames stacked k deep when frame_stack k > 1."""
    factory = _env_factory(env_id)
    if frame_stack < 0:
        raise ValueError(f"frame_stack must be >= 0, got {frame_stack}")
    if frame_stack <= 1:
        return factory

    def make_stacked(**kwargs) -> gym.Env:
        env = factory(**kwargs)
        try:
            return StackFrames(env, frame_stack)
        except ValueError as e:
            env.close()
            raise ValueError(f"{env_id}: {e}") from e

    return make_stacked


def check_spaces(env_id: str, observation_space: spaces.Space, action_space: spaces.Space):
    """ValueError naming what the trainers take, for spaces they cannot handle."""
    if not isinstance(action_space, spaces.Discrete | spaces.Box) or (
        isinstance(action_space, spaces.Box) and len(action_space.shape) != 1
    ):
        raise ValueError(
            f"{env_id}: action space {action_space} is not supported; the trainers take "
            "Discrete actions or a 1-D Box of continuous actions"
        )
    shape = getattr(observation_space, "shape", None) or ()
    if not isinstance(observation_space, spaces.Box) or len(shape) not in (1, 3):
        raise ValueError(
            f"{env_id}: observation space {observation_space} is not supported; the policies "
            "take a 1-D Box (the MLP) or uint8 images [C, H, W] / [H, W, C] (the CNN)"
        )


class GymnasiumVectorEnv:
    """`num_envs` copies of a Gymnasium environment with the native VectorEnv's interface as
    the runtime uses it: spaces, `info`, `torch.reset`, `torch.step(actions, out=rows)`,
    `state_dict` and `close`. Env i is seeded with seed + i, as Gymnasium's vector envs do."""

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, frame_stack: int = 0):
        """frame_stack k > 1: each observation is the env's last k frames (StackFrames)."""
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        factory = make_one(env_id, frame_stack)
        try:
            self.envs = gym.vector.SyncVectorEnv(
                [factory] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP
            )
        except (gym.error.Error, ImportError) as e:  # a missing extra (Box2D, MuJoCo, ALE)
            raise ValueError(f"environment {env_id!r} cannot be made: {e}") from e
        self.num_envs = num_envs
        self.single_observation_space = self.envs.single_observation_space
        self.single_action_space = self.envs.single_action_space
        check_spaces(env_id, self.single_observation_space, self.single_action_space)
        spec = self.envs.envs[0].spec
        self.info = AdapterInfo(
            env_id,
            self.single_observation_space,
            self.single_action_space,
            spec.max_episode_steps if spec else None,
            spec.reward_threshold if spec else None,
        )
        self.seed = seed  # the first reset's, when it names none
        self.torch = _TorchSide(self)
        self.closed = False

    def state_dict(self) -> dict[str, Any]:
        """Every environment's state as data (nostall.envs.env_state: arrays, numbers, the
        generators' states; no pickle), and which are due an autoreset: exact resume, or a
        ValueError naming what an environment holds that a checkpoint cannot."""
        try:
            envs = [env_state(env, self.info.id) for env in self.envs.envs]
        except EnvStateError as e:
            raise ValueError(
                f"the environment cannot be saved for a checkpoint: {e} (not "
                "data a checkpoint holds; give the environment state_dict() / "
                "load_state_dict() of arrays and numbers, or run without "
                "--checkpoint)"
            ) from None
        return {
            "env_id": self.info.id,
            "num_envs": self.num_envs,
            "envs": envs,
            "autoreset": torch.from_numpy(np.asarray(self.envs._autoreset_envs, dtype=bool).copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("env_id"), state.get("num_envs")) != (self.info.id, self.num_envs):
            raise ValueError(
                f"checkpoint is for {state.get('env_id')} x {state.get('num_envs')}, "
                f"not {self.info.id} x {self.num_envs}"
            )
        if not isinstance(state.get("envs"), list):  # (pickled bytes, before: never unpickled)
            raise ValueError(
                f"the checkpoint holds {self.info.id}'s environments as a pickle, "
                "which this nostall does not load (it could run code): resume "
                "from a checkpoint this version wrote"
            )
        for env, saved in zip(self.envs.envs, state["envs"], strict=True):
            # Reset once first, so that what an environment sets on reset exists to be
            # restored into: a checkpoint sets no attribute the environment never has.
            env.reset(seed=0)
            load_env_state(env, saved, self.info.id)
        # sync: none, the checkpoint's host tensor
        self.envs._autoreset_envs = state["autoreset"].numpy().astype(bool, copy=True)

    def close(self) -> None:
        if not self.closed:
            self.envs.close()
            self.closed = True

    def __repr__(self) -> str:
        return f"nostall.envs.GymnasiumVectorEnv({self.info.id}, num_envs={self.num_envs})"


class _TorchSide:
    """The tensor interface the rollout writes through (the native TorchVectorEnv's)."""

    def __init__(self, env: GymnasiumVectorEnv):
        self.env = env
        space = env.single_action_space
        self._low = self._high = None
        if isinstance(space, spaces.Box):  # clip as the native envs do: out of range -> bound
            self._low, self._high = space.low, space.high

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.env.envs.reset(seed=self.env.seed if seed is None else seed)
        self.env.seed = None  # later resets continue the generators
        return obs_rows(obs, self.env.single_observation_space)

    def step(self, actions: torch.Tensor, out: EnvStep) -> EnvStep:
        a = actions.numpy()  # sync: none; the rollout side's actions are host tensors
        if self._low is not None:
            a = np.clip(a, self._low, self._high)
        obs, reward, terminated, truncated, info = self.env.envs.step(a)
        out.obs.copy_(obs_rows(obs, self.env.single_observation_space))
        out.reward.copy_(torch.from_numpy(np.asarray(reward, dtype=np.float64)))
        out.terminated.copy_(torch.from_numpy(np.asarray(terminated, dtype=bool)))
        out.truncated.copy_(torch.from_numpy(np.asarray(truncated, dtype=bool)))
        if "_final_obs" in info and out.final_obs.shape[0]:
            for i in np.flatnonzero(info["_final_obs"]):
                final = np.asarray(info["final_obs"][i]).reshape(-1)
                out.final_obs[i].copy_(torch.from_numpy(final))
        return out

    def empty_step(self, device: torch.device | str = "cpu") -> EnvStep:
        return empty_step(self.env, device)


def obs_rows(obs, space: spaces.Box) -> torch.Tensor:
    """A batch of observations as the chunks' rows [N, obs_dim]: images flattened and kept
    uint8, vectors as float32."""
    obs = np.asarray(obs)
    dtype = np.uint8 if space.dtype == np.uint8 else np.float32
    return torch.from_numpy(np.ascontiguousarray(obs.reshape(len(obs), -1), dtype=dtype))


def empty_step(env, device: torch.device | str = "cpu") -> EnvStep:
    """Uninitialised rows of one step of an adapted env (its storage layout: slot_layout)."""
    layout = slot_layout(env)
    n, obs_dim, obs_dtype = layout["num_envs"], layout["obs_dim"], layout["obs_dtype"]
    return EnvStep(
        torch.empty(n, obs_dim, dtype=obs_dtype, device=device),
        torch.empty(n, dtype=torch.float64, device=device),
        torch.empty(n, dtype=torch.bool, device=device),
        torch.empty(n, dtype=torch.bool, device=device),
        torch.empty(n, obs_dim, dtype=obs_dtype, device=device),
    )
