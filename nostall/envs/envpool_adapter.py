"""EnvPool's environments (Atari, MuJoCo, whatever the installed EnvPool ships) behind the
interface nostall's runtime steps, with `--env-backend envpool`.

EnvPool steps its environments in C++ threads through send/recv: the step sends the actions and
receives every env's result (reordered by env id). EnvPool resets a finished env on the call
after it finished; nostall's chunks take same-step autoreset (the next episode's first
observation right after the last one, the last one kept in final_obs), so the adapter resets
finished envs at once, by id. EnvPool frames arrive stacked ([4, 84, 84] uint8 for Atari) and
stay uint8 in the chunks."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from nostall.envs.gymnasium_adapter import AdapterInfo, check_spaces, empty_step, obs_rows
from nostall.envs.vector import EnvStep


def _envpool():
    try:
        import envpool
    except ImportError as e:
        raise ValueError("--env-backend envpool needs EnvPool: pip install envpool") from e
    return envpool


class EnvPoolVectorEnv:
    """`num_envs` EnvPool environments with the native VectorEnv's interface as the runtime
    uses it. Env i is seeded with seed + i (EnvPool's own convention)."""

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, num_threads: int = 0):
        envpool = _envpool()
        if env_id not in envpool.list_all_envs():
            import difflib

            close = difflib.get_close_matches(env_id, envpool.list_all_envs(), n=5, cutoff=0.6)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise ValueError(f"EnvPool has no environment {env_id!r}{hint}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.pool = envpool.make(
            env_id, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs, seed=seed,
            num_threads=num_threads,
        )  # fmt: skip
        self.num_envs = num_envs
        self.single_observation_space = self.pool.observation_space
        self.single_action_space = self.pool.action_space
        check_spaces(env_id, self.single_observation_space, self.single_action_space)
        spec = self.pool.spec
        config = getattr(spec, "config", None)
        max_steps = getattr(config, "max_episode_steps", None)
        # EnvPool's classic-control and MuJoCo ids are Gymnasium's: take its solved return.
        threshold = gym.spec(env_id).reward_threshold if env_id in gym.registry else None
        self.info = AdapterInfo(env_id, self.single_observation_space,
                                self.single_action_space, max_steps, threshold)  # fmt: skip
        self.torch = _TorchSide(self)
        self.closed = False

    def state_dict(self) -> dict[str, Any]:
        raise ValueError(
            f"{self.info.id}: EnvPool environments cannot be saved for a checkpoint (EnvPool "
            "exposes no state); run without --checkpoint"
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state_dict()  # the same error

    def close(self) -> None:
        if not self.closed:
            self.pool.close()
            self.closed = True

    def __repr__(self) -> str:
        return f"nostall.envs.EnvPoolVectorEnv({self.info.id}, num_envs={self.num_envs})"


class _TorchSide:
    def __init__(self, env: EnvPoolVectorEnv):
        self.env = env
        self._ids = np.arange(env.num_envs, dtype=np.int32)
        space = env.single_action_space
        self._discrete = isinstance(space, spaces.Discrete)
        self._low, self._high = (None, None) if self._discrete else (space.low, space.high)
        self._space = env.single_observation_space

    def reset(self, seed: int | None = None) -> torch.Tensor:
        # EnvPool seeds at construction (make_env passes the seed); reset starts episodes.
        obs, _ = self.env.pool.reset()
        return obs_rows(obs, self._space)

    def step(self, actions: torch.Tensor, out: EnvStep) -> EnvStep:
        a = actions.numpy()  # sync: none; the rollout side's actions are host tensors
        a = a.astype(np.int32) if self._discrete else np.clip(a, self._low, self._high)
        self.env.pool.send(a, self._ids)
        obs, reward, terminated, truncated, info = self.env.pool.recv()
        order = np.argsort(info["env_id"])  # recv gives the envs in the order they finished
        obs, reward = obs[order], reward[order]
        terminated, truncated = terminated[order], truncated[order]
        done = np.flatnonzero(terminated | truncated)
        if len(done):
            out.final_obs[done] = obs_rows(obs[done], self._space)
            fresh, fresh_info = self.env.pool.reset(self._ids[done])  # same-step autoreset
            obs = obs.copy()
            obs[fresh_info["env_id"]] = fresh
        out.obs.copy_(obs_rows(obs, self._space))
        out.reward.copy_(torch.from_numpy(reward.astype(np.float64)))
        out.terminated.copy_(torch.from_numpy(terminated))
        out.truncated.copy_(torch.from_numpy(truncated))
        return out

    def empty_step(self, device: torch.device | str = "cpu") -> EnvStep:
        return empty_step(self.env, device)
