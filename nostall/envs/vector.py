"""Native vector environments with Gymnasium's VectorEnv API (NumPy) and a torch API.

    env = nostall.envs.make("CartPole-v1", num_envs=64, seed=0)
    obs, info = env.reset()                        # NumPy, as any Gymnasium vector env
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

    obs = env.torch.reset()                        # tensors, through the same native envs
    step = env.torch.step(actions)                 # obs, reward, terminated, truncated, final_obs
    env.torch.send(actions, env_ids); batch = env.torch.recv()   # EnvPool-style async

Each call is one custom operator on an integer handle (torch.ops.nostall.env_*), registered as
an ordered effect, so a loop of policy -> env.torch.step compiles whole and keeps its order.
The NumPy step, which nothing compiles, skips the dispatcher: one plain C call into the same
engine, writing into buffers made once (host_step.py).
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from nostall.envs import _ops
from nostall.envs.gymnasium_bridge import set_gymnasium_state
from nostall.envs.host_step import HostStepper
from nostall.envs.registry import env_info

ops = torch.ops.nostall
_MODES = {AutoresetMode.NEXT_STEP: 0, AutoresetMode.SAME_STEP: 1}


class EnvStep(NamedTuple):
    obs: torch.Tensor  # float32 [num_envs, obs_dim]
    reward: torch.Tensor  # float64 [num_envs]
    terminated: torch.Tensor  # bool [num_envs]
    truncated: torch.Tensor  # bool [num_envs]
    final_obs: torch.Tensor  # float32 [num_envs, obs_dim] (same-step autoreset), else [0, obs_dim]

    def rows(self, index: slice) -> EnvStep:
        """The same step's rows `index` (views): one group of environments."""
        final_obs = self.final_obs[index] if self.final_obs.shape[0] else self.final_obs
        return EnvStep(
            self.obs[index],
            self.reward[index],
            self.terminated[index],
            self.truncated[index],
            final_obs,
        )


class EnvBatch(NamedTuple):
    obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    final_obs: torch.Tensor
    env_ids: torch.Tensor  # int64 [batch_size]: which environment each row belongs to


def _autoreset_mode(mode: AutoresetMode | str) -> AutoresetMode:
    try:
        mode = AutoresetMode(mode) if isinstance(mode, str) else mode
    except ValueError:
        mode = None
    if mode not in _MODES:
        names = ", ".join(m.value for m in _MODES)
        raise ValueError(f"autoreset_mode must be one of {names}")
    return mode


def _host(t: torch.Tensor) -> np.ndarray:
    return t.numpy()  # sync: none; the env ops return host tensors, this is a zero-copy view


def _close_handle(handle: int) -> None:
    _ops.OPEN.pop(handle, None)
    ops.env_close(handle)


class VectorEnv(gym.vector.VectorEnv):
    """`num_envs` copies of a native environment, as a Gymnasium vector env."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        num_threads: int = 1,
        seed: int = 0,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        batch_size: int | None = None,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        copy: bool = True,
    ):
        self.info = env_info(env_id)
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be at least 1, got {max_episode_steps}")
        mode = _autoreset_mode(autoreset_mode)
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.handle: int = ops.env_create(
            env_id,
            num_envs,
            num_threads,
            seed,
            _MODES[mode],
            -1 if batch_size is None else batch_size,
            -1 if max_episode_steps is None else max_episode_steps,
        )
        self._finalizer = weakref.finalize(self, _close_handle, self.handle)
        self.num_envs = num_envs
        self.batch_size = num_envs if batch_size is None else batch_size
        self.max_episode_steps = max_episode_steps or self.info.max_episode_steps
        self.metadata = {"autoreset_mode": mode, "render_modes": ["rgb_array"]}
        self.render_mode = render_mode
        self.single_observation_space = self.info.observation_space
        self.single_action_space = self.info.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        _ops.OPEN[self.handle] = _ops.HandleSizes(
            num_envs,
            self.single_observation_space.shape[0],
            self.info.state_dim,
            self.batch_size,
            mode == AutoresetMode.SAME_STEP,
        )
        self._renderers: list[gym.Env] | None = None
        self.copy = copy
        self._buffers: _StepBuffers | None = None  # the NumPy step's, made on the first step

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @closed.setter
    def closed(self, value: bool) -> None:
        # gymnasium.vector.VectorEnv assigns `closed`; the finalizer is the source of truth.
        pass

    @property
    def torch(self) -> TorchVectorEnv:
        """The same environments through tensors (no NumPy conversion)."""
        return TorchVectorEnv(self)

    def _require_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"{self.info.id}: the environment is closed")

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Resets every environment; `seed` reseeds env i with seed + i, as Gymnasium does."""
        self._require_open()
        if options:
            raise ValueError("nostall environments take no reset options")
        obs = ops.env_reset(self.handle, _seed(seed))
        return _host(obs), {}

    def _action_tensor(self, actions) -> torch.Tensor:
        a = np.asarray(actions)
        if self.info.discrete:
            if not np.issubdtype(a.dtype, np.integer):
                raise TypeError(f"{self.info.id}: actions must be integers, got {a.dtype}")
            a = a.astype(np.int64, copy=False)
        else:
            if not np.issubdtype(a.dtype, np.floating):
                raise TypeError(f"{self.info.id}: actions must be floats, got {a.dtype}")
            # A float64 action past float32's range becomes +-inf, which the environments clip
            # to their bounds like any out-of-range action: not worth a warning.
            with np.errstate(over="ignore"):
                a = a.astype(np.float32, copy=False)
        return torch.as_tensor(np.ascontiguousarray(a))

    def step(
        self, actions
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Gymnasium's vector step. The native op writes into buffers made once, the actions
        are copied into one made once, and the arrays returned are copies of the buffers
        (`copy=True`, the default) or the buffers themselves (`copy=False`: valid until the
        next step, as Gymnasium's `copy=False`)."""
        self._require_open()
        if self._buffers is None:
            self._buffers = _StepBuffers(self)
        b = self._buffers
        a = b.actions_for(actions)
        if a is b.actions:  # the usual case: straight into the engine, no dispatcher
            done = b.host_step()
        else:  # an odd dtype or shape: the op's checks say what is wrong
            ops.env_step_into(self.handle, a, *b.out)
            done = int(np.logical_or(b.terminated, b.truncated).any())
        infos = self._final_obs_infos(b) if b.same_step and done else {}
        if self.copy:
            return b.obs.copy(), b.reward.copy(), b.terminated.copy(), b.truncated.copy(), infos
        return b.obs, b.reward, b.terminated, b.truncated, infos

    def _final_obs_infos(self, b: _StepBuffers) -> dict[str, Any]:
        done = np.logical_or(b.terminated, b.truncated)
        finals = np.full(len(done), None, dtype=object)
        for i in np.flatnonzero(done):
            finals[i] = b.final_obs[i].copy()
        return {"final_obs": finals, "_final_obs": done, "final_info": {}, "_final_info": done}

    def _infos(self, terminated, truncated, final_obs) -> dict[str, Any]:
        if final_obs.shape[0] == 0:
            return {}
        done = _host(terminated | truncated)
        if not done.any():
            return {}
        # Gymnasium's same-step layout: an object array with the final observation of each env
        # that finished (None elsewhere), and a mask.
        finals = np.full(len(done), None, dtype=object)
        for i in np.flatnonzero(done):
            finals[i] = _host(final_obs[i])
        return {"final_obs": finals, "_final_obs": done, "final_info": {}, "_final_info": done}

    def send(self, actions, env_ids=None) -> None:
        """Queues one step for each env in `env_ids` (all envs when None); returns at once."""
        self._require_open()
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        if not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"{self.info.id}: env_ids must be integers, got {ids.dtype}")
        ids = ids.astype(np.int64, copy=False)
        ops.env_send(self.handle, self._action_tensor(actions), torch.as_tensor(ids))

    def recv(self):
        """The first `batch_size` queued steps to finish: (obs, reward, terminated, truncated,
        info) with `info["env_id"]` saying which environment each row belongs to."""
        self._require_open()
        b = EnvBatch(*ops.env_recv(self.handle))
        infos = self._infos(b.terminated, b.truncated, b.final_obs)
        infos["env_id"] = _host(b.env_ids)
        return _host(b.obs), _host(b.reward), _host(b.terminated), _host(b.truncated), infos

    def get_state(self) -> np.ndarray:
        """Exact simulator state, float64 [num_envs, state_dim] (for tests and checkpoints)."""
        self._require_open()
        return _host(ops.env_get_state(self.handle))

    def set_state(self, state: np.ndarray) -> None:
        self._require_open()
        ops.env_set_state(self.handle, torch.as_tensor(np.asarray(state, dtype=np.float64)))

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: generators, episode step counts, states."""
        self._require_open()
        return {
            "env_id": self.info.id,
            "num_envs": self.num_envs,
            "words": ops.env_save(self.handle),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._require_open()
        if (state.get("env_id"), state.get("num_envs")) != (self.info.id, self.num_envs):
            raise ValueError(
                f"checkpoint is for {state.get('env_id')} x {state.get('num_envs')}, "
                f"not {self.info.id} x {self.num_envs}"
            )
        ops.env_load(self.handle, state["words"])

    def render(self) -> tuple[np.ndarray, ...] | None:
        """RGB frames of every environment, drawn by Gymnasium's own renderer from our state."""
        self._require_open()
        if self.render_mode is None:
            return None
        if self._renderers is None:
            self._renderers = [
                gym.make(self.info.id, render_mode="rgb_array").unwrapped
                for _ in range(self.num_envs)
            ]
        frames = []
        for renderer, state in zip(self._renderers, self.get_state(), strict=True):
            set_gymnasium_state(self.info.id, renderer, state)
            frames.append(renderer.render())
        return tuple(frames)

    def close(self, **kwargs: Any) -> None:
        """Frees the environments and their threads. Safe to call twice."""
        if self._renderers is not None:
            for renderer in self._renderers:
                renderer.close()
            self._renderers = None
        self._finalizer()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"handle {self.handle}"
        return f"nostall.envs.VectorEnv({self.info.id}, num_envs={self.num_envs}, {state})"


class _StepBuffers:
    """The NumPy step's preallocated tensors and their NumPy views (one allocation per env,
    not one per step)."""

    def __init__(self, env: VectorEnv):
        self.env_id, self.discrete = env.info.id, env.info.discrete
        self.out = env.torch.empty_step()
        # sync: none; host tensors, so these are zero-copy views made once
        self.obs, self.reward, self.terminated, self.truncated, self.final_obs = (
            t.numpy() for t in self.out
        )
        self.same_step = self.out.final_obs.shape[0] > 0
        shape = env.action_space.shape
        self.actions = torch.zeros(shape, dtype=torch.int64 if self.discrete else torch.float32)
        self._actions = self.actions.numpy()  # sync: none; a host tensor's zero-copy view
        self._dtype = self._actions.dtype
        self.host_step = HostStepper(env.handle, self.actions, tuple(self.out))

    def actions_for(self, actions) -> torch.Tensor:
        """`actions` as the op's action tensor: copied into the action buffer when they are
        integers (discrete) or floats (continuous) of the batch's shape; any other shape goes
        to the op as it is, for the op's own error."""
        a = actions if type(actions) is np.ndarray else np.asarray(actions)
        if a.dtype is self._dtype and a.shape == self._actions.shape:  # the usual case
            np.copyto(self._actions, a)
            return self.actions
        kind = a.dtype.kind
        if self.discrete:
            if kind not in "iu":
                raise TypeError(f"{self.env_id}: actions must be integers, got {a.dtype}")
        elif kind != "f":
            raise TypeError(f"{self.env_id}: actions must be floats, got {a.dtype}")
        if kind == "u" and a.max(initial=0) > np.iinfo(np.int64).max:
            return torch.as_tensor(a)  # no int64 holds it: the op refuses the dtype
        # A float64 action past float32's range becomes +-inf, which the environments clip to
        # their bounds like any out-of-range action: not worth a warning.
        with np.errstate(over="ignore"):
            if a.shape != self._actions.shape:
                return torch.as_tensor(a.astype(self._dtype))
            np.copyto(self._actions, a, casting="unsafe")
        return self.actions


class TorchVectorEnv:
    """The torch interface of a VectorEnv: tensors in and out, one native call each."""

    def __init__(self, env: VectorEnv):
        self.env = env
        self.handle = env.handle

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Resets every environment; returns obs float32 [num_envs, obs_dim] on the CPU."""
        self.env._require_open()
        return ops.env_reset(self.handle, _seed(seed))

    def step(self, actions: torch.Tensor, out: EnvStep | None = None) -> EnvStep:
        """Steps every environment. Actions: int64 [num_envs] (discrete) or float32
        [num_envs, action_dim] (continuous). Outputs live on the actions' device; with CUDA
        actions the step is ordered on the current stream and the host never waits.

        With `out` (see `empty_step`; rows of a rollout buffer, say), the step writes into
        those tensors instead of allocating new ones, and returns `out`."""
        # The overloads themselves: the packet's overload resolution costs 1-2 us a call.
        if out is None:
            return EnvStep(*ops.env_step.default(self.handle, actions))
        ops.env_step_into.default(self.handle, actions, *out)
        return out

    def empty_step(self, device: torch.device | str = "cpu") -> EnvStep:
        """Uninitialised output tensors of one step, for `step(actions, out=...)`."""
        n, obs_dim = self.env.num_envs, self.env.single_observation_space.shape[0]
        same_step = self.env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        return EnvStep(
            torch.empty(n, obs_dim, device=device),
            torch.empty(n, dtype=torch.float64, device=device),
            torch.empty(n, dtype=torch.bool, device=device),
            torch.empty(n, dtype=torch.bool, device=device),
            torch.empty(n if same_step else 0, obs_dim, device=device),
        )

    def send(self, actions: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        if env_ids is None:
            env_ids = torch.arange(self.env.num_envs)
        ops.env_send(self.handle, actions, env_ids)

    def recv(self) -> EnvBatch:
        return EnvBatch(*ops.env_recv(self.handle))


def _seed(seed: int | None) -> int:
    """A reset seed for the native op (-1: keep each environment's generator)."""
    if seed is None:
        return -1
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return int(seed)


def make(env_id: str, num_envs: int = 1, **kwargs: Any) -> VectorEnv:
    """Opens `num_envs` native copies of `env_id`; see VectorEnv for the options."""
    return VectorEnv(env_id, num_envs, **kwargs)
