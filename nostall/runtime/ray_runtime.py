"""The environments' rollout side on Ray: RayLoop (ray_loop.py: K worker actors, in-order
slots, the staleness bound across workers, weights once per version, lost-worker accounting,
checkpoints) filled by EnvSide (env_side.py), with Runtime's trainer-facing interface, so a
PPO trainer runs on threads, a process or a cluster without knowing which.

    runtime = RayRuntime(make_env, make_agent, agent, act, num_workers=2, num_steps=128,
                         staleness=1, seed=0, **slot_layout(env))
    with runtime:
        slot, chunk = runtime.next_chunk()   # chunk.version, chunk.worker, chunk.seq

Each worker w seeds its N envs with seed + w * N + i and its sampling generator with seed + w;
episode statistics are kept per worker on the trainer's side, from the chunks it receives."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from nostall.runtime.env_runtime import LoopRuntime
from nostall.runtime.env_side import make_env_side
from nostall.runtime.ray_loop import RayLoop, RayOptions
from nostall.runtime.rollout import ActFn
from nostall.runtime.storage import rollout_slots


class RayRuntime(LoopRuntime):
    def __init__(
        self,
        make_env: Callable[[int], object],
        make_agent: Callable,
        agent: torch.nn.Module,
        act: ActFn,
        *,
        num_workers: int = 1,
        num_steps: int,
        num_envs: int,
        obs_dim: int,
        action_shape: tuple[int, ...],
        discrete: bool,
        obs_dtype: torch.dtype = torch.float32,
        staleness: int = 0,
        seed: int = 0,
        rollout: Callable | None = None,
        address: str | None = None,
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0.0,
        max_restarts: int = 3,
        weights: str = "store",
    ):
        """make_env(seed) -> one worker's vector env; make_agent(env) -> a policy of `agent`'s
        architecture. `address`: None starts a local cluster, "auto" joins a running one."""
        slots = rollout_slots(
            0,
            num_steps,
            num_envs=num_envs,
            obs_dim=obs_dim,
            action_shape=action_shape,
            discrete=discrete,
            obs_dtype=obs_dtype,
        )
        make_side = functools.partial(
            make_env_side, make_env, make_agent, act, rollout, seed, num_envs
        )
        options = RayOptions(
            num_workers=num_workers,
            address=address,
            cpus_per_worker=cpus_per_worker,
            gpus_per_worker=gpus_per_worker,
            max_restarts=max_restarts,
            weights=weights,
        )
        loop = RayLoop(slots, make_side, agent, staleness=staleness, options=options)
        super().__init__(loop, num_workers=num_workers, num_envs=num_envs)
        self.loss = loop.loss
        self._template = agent

    @property
    def workers(self) -> list:
        return self.loop.workers

    @property
    def trained(self) -> list[tuple[int, int]]:
        return self.loop.trained
