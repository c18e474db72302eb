"""EnvPool's environments (Atari, MuJoCo, whatever the installed EnvPool ships) behind the
interface nostall's runtime steps, with `--env-backend envpool`.

EnvPool steps its environments in C++ threads through send/recv: the step sends the actions and
receives every env's result (reordered by env id). EnvPool resets a finished env on the call
after it finished; nostall's chunks take same-step autoreset (the next episode's first
observation right after the last one, the last one kept in final_obs), so the adapter resets
finished envs at once, by id. EnvPool frames arrive stacked ([4, 84, 84] uint8 for Atari) and
stay uint8 in the chunks.

Stepping overlaps inference: the envs are split into two pools (halves), and the rollout sends
one half's actions, then computes the other half's while the first half steps in EnvPool's
threads (nostall.runtime.rollout's pipelined collection; `send` and `recv` below). A plain
`step` sends both halves before receiving either, so the two step at once."""

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
    uses it. Env i is seeded with seed + i (EnvPool's own convention), so the split into
    halves changes no environment. `halves=False` keeps one pool (one group)."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int = 0,
        num_threads: int = 0,
        halves: bool = True,
        render_mode: str | None = None,
        frame_stack: int = 0,
    ):
        """frame_stack k >= 1: EnvPool's stack_num (its Atari envs stack 4 by default)."""
        envpool = _envpool()
        if env_id not in envpool.list_all_envs():
            import difflib

            close = difflib.get_close_matches(env_id, envpool.list_all_envs(), n=5, cutoff=0.6)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise ValueError(f"EnvPool has no environment {env_id!r}{hint}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        half = num_envs // 2 if halves and num_envs > 1 else 0
        extra = {} if render_mode is None else {"render_mode": render_mode}
        if frame_stack >= 1:
            extra["stack_num"] = frame_stack
        # The envs of each pool, as rows of the vector env.
        self.groups = [slice(0, half), slice(half, num_envs)] if half else [slice(0, num_envs)]
        self.pools, self.closed = [], False
        for first, size in ((group.start, group.stop - group.start) for group in self.groups):
            try:
                pool = envpool.make(
                    env_id,
                    env_type="gymnasium",
                    num_envs=size,
                    batch_size=size,
                    seed=seed + first,
                    num_threads=num_threads,
                    **extra,
                )
            except (TypeError, ValueError, AssertionError) as e:  # a config key it lacks
                self.close()
                raise ValueError(f"EnvPool's {env_id} cannot be made with {extra}: {e}") from e
            self.pools.append(pool)
        self.num_envs = num_envs
        pool = self.pools[0]
        self.single_observation_space = pool.observation_space
        self.single_action_space = pool.action_space
        check_spaces(env_id, self.single_observation_space, self.single_action_space)
        config = getattr(pool.spec, "config", None)
        max_steps = getattr(config, "max_episode_steps", None)
        # EnvPool's classic-control and MuJoCo ids are Gymnasium's: take its solved return.
        threshold = gym.spec(env_id).reward_threshold if env_id in gym.registry else None
        self.info = AdapterInfo(
            env_id, self.single_observation_space, self.single_action_space, max_steps, threshold
        )
        self.torch = _TorchSide(self)

    def render(self) -> np.ndarray:
        """Frames [num_envs, H, W, 3] of every env (made with render_mode="rgb_array")."""
        return np.concatenate(
            [pool.render(env_ids=np.arange(pool.config["num_envs"])) for pool in self.pools]
        )

    def state_dict(self) -> dict[str, Any]:
        raise ValueError(
            f"{self.info.id}: EnvPool environments cannot be saved for a checkpoint (EnvPool "
            "exposes no state); run without --checkpoint"
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state_dict()  # the same error

    def close(self) -> None:
        if not self.closed:
            for pool in self.pools:
                pool.close()
            self.closed = True

    def __repr__(self) -> str:
        return f"nostall.envs.EnvPoolVectorEnv({self.info.id}, num_envs={self.num_envs})"


class _TorchSide:
    """The tensor interface the rollout writes through: `step` (the native envs'), and per
    group `send` / `recv`, for stepping one group while the policy acts on the other."""

    def __init__(self, env: EnvPoolVectorEnv):
        self.env = env
        self.groups = env.groups
        self._ids = [np.arange(g.stop - g.start, dtype=np.int32) for g in env.groups]
        space = env.single_action_space
        self._discrete = isinstance(space, spaces.Discrete)
        self._low, self._high = (None, None) if self._discrete else (space.low, space.high)
        self._space = env.single_observation_space
        self._sent = [False] * len(env.groups)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        # EnvPool seeds at construction (make_env passes the seed); reset starts episodes.
        if any(self._sent):  # a step in flight would be received as the reset's
            for group in np.flatnonzero(self._sent):
                self.env.pools[group].recv()
                self._sent[group] = False
        return torch.cat([obs_rows(pool.reset()[0], self._space) for pool in self.env.pools])

    def send(self, group: int, actions: torch.Tensor) -> None:
        """Starts group `group`'s step with its rows' actions; returns at once."""
        if self._sent[group]:
            raise RuntimeError(f"group {group} already has a step in flight; recv it first")
        a = actions.numpy()  # sync: none; the rollout side's actions are host tensors
        a = a.astype(np.int32) if self._discrete else np.clip(a, self._low, self._high)
        self.env.pools[group].send(a, self._ids[group])
        self._sent[group] = True

    def recv(self, group: int, out: EnvStep) -> EnvStep:
        """Waits for group `group`'s step and writes it into `out` (that group's rows), with
        same-step autoreset."""
        if not self._sent[group]:
            raise RuntimeError(f"group {group} has no step in flight; send it first")
        pool = self.env.pools[group]
        obs, reward, terminated, truncated, info = pool.recv()
        self._sent[group] = False
        order = np.argsort(info["env_id"])  # recv gives the envs in the order they finished
        obs, reward = obs[order], reward[order]
        terminated, truncated = terminated[order], truncated[order]
        done = np.flatnonzero(terminated | truncated)
        if len(done):
            out.final_obs[done] = obs_rows(obs[done], self._space)
            fresh, fresh_info = pool.reset(self._ids[group][done])  # same-step autoreset
            obs = obs.copy()
            obs[fresh_info["env_id"]] = fresh
        out.obs.copy_(obs_rows(obs, self._space))
        out.reward.copy_(torch.from_numpy(reward.astype(np.float64)))
        out.terminated.copy_(torch.from_numpy(terminated))
        out.truncated.copy_(torch.from_numpy(truncated))
        return out

    def step(self, actions: torch.Tensor, out: EnvStep) -> EnvStep:
        """Every group sent before any is received: the groups step at once."""
        for group, rows in enumerate(self.groups):
            self.send(group, actions[rows])
        for group, rows in enumerate(self.groups):
            self.recv(group, out.rows(rows))
        return out

    def empty_step(self, device: torch.device | str = "cpu") -> EnvStep:
        return empty_step(self.env, device)
