"""The environments' rollout side in a process of its own: ProcessLoop (process_loop.py: shared
memory chunks and weights, the staleness bound, failures both ways within about a second,
checkpoints at the child's wait for a version) filled by EnvSide (env_side.py), with Runtime's
trainer-facing interface. No GIL is shared between the two sides, so collecting and learning
really overlap on two cores.

The rollout process builds its own environments and policy copy from picklable recipes.
Checkpoints have the thread backend's keys, so a checkpoint resumes on either.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from nostall.runtime.env_runtime import LoopRuntime
from nostall.runtime.env_side import EnvSide
from nostall.runtime.process_loop import ProcessLoop
from nostall.runtime.rollout import ActFn
from nostall.runtime.storage import rollout_slots


def _process_side(make_env: Callable, make_agent: Callable, act: ActFn, rollout, seed: int):
    """In the rollout process: its envs (seeded by make_env), policy copy and generator."""
    env = make_env()
    return EnvSide(env, make_agent(env), act, rollout, seed, seed)


class ProcessRuntime(LoopRuntime):
    def __init__(
        self,
        make_env: Callable,
        make_agent: Callable,
        agent: torch.nn.Module,
        act: ActFn,
        *,
        num_envs: int,
        obs_dim: int,
        action_shape: tuple[int, ...],
        discrete: bool,
        num_steps: int,
        obs_dtype: torch.dtype = torch.float32,
        staleness: int = 0,
        seed: int = 0,
        join_timeout_s: float = 5.0,
        liveness_timeout_s: float = 60.0,
        rollout: Callable | None = None,
        torch_threads: int = 1,
    ):
        """make_env() -> the vector env; make_agent(env) -> a policy of `agent`'s architecture;
        `act(agent, obs, generator)` steps it, or `rollout(agent, env, chunk, generator)`
        collects a whole chunk in one call."""
        # Shared memory cannot also be pinned: a trainer on a GPU copies these chunks with a
        # host wait (each a few kB); the thread backend pins its chunks instead.
        slots = rollout_slots(
            staleness,
            num_steps,
            num_envs=num_envs,
            obs_dim=obs_dim,
            action_shape=action_shape,
            discrete=discrete,
            obs_dtype=obs_dtype,
        )
        make_side = functools.partial(_process_side, make_env, make_agent, act, rollout, seed)
        loop = ProcessLoop(
            slots,
            make_side,
            agent,
            staleness=staleness,
            torch_threads=torch_threads,
            join_timeout_s=join_timeout_s,
            liveness_timeout_s=liveness_timeout_s,
        )
        super().__init__(loop, num_workers=1, num_envs=num_envs)

    @property
    def _child(self):  # the child process's watcher (its timeouts, for tests)
        return self.loop._child

    @property
    def _process(self):
        return self.loop._child.process
