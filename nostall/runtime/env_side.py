"""The environments' rollout side as a fill for any transport (RolloutLoop's thread,
ProcessLoop's process, RayLoop's workers): its vector env, a policy copy, a sampling generator
and the observation the next chunk starts from; `side(chunk)` fills one chunk."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import torch

from nostall.runtime.rollout import ActFn, collect
from nostall.runtime.storage import Chunk, rollout_slots
from nostall.runtime.transports import SideRecipe


class EnvSide:
    def __init__(
        self,
        env,
        model: torch.nn.Module,
        act: ActFn,
        rollout: Callable | None,
        generator_seed: int,
        reset_seed: int,
    ):
        """`act(model, obs, generator)` steps the policy; `rollout(model, env, chunk,
        generator)`, when given, collects a whole chunk in one call instead."""
        self.env, self.model = env, model
        self._act = functools.partial(act, model)
        self._rollout = None if rollout is None else functools.partial(rollout, model)
        self.generator = torch.Generator().manual_seed(generator_seed)
        self.next_obs = env.torch.reset(seed=reset_seed)

    def __call__(self, chunk: Chunk) -> None:
        # No episode count here: the runtime keeps it from the chunks the trainer receives.
        collect(self.env, self._act, chunk, self.next_obs, self.generator, None, self._rollout)
        self.next_obs = chunk.obs[-1].clone()

    def stats(self) -> dict:
        """Figures a transport sends with each chunk: none (the trainer counts episodes)."""
        return {}

    def state_dict(self) -> dict:
        return {
            "env": self.env.state_dict(),
            "generator": self.generator.get_state(),
            "next_obs": self.next_obs.clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.env.load_state_dict(state["env"])
        self.generator.set_state(state["generator"])
        self.next_obs = state["next_obs"].clone()


def make_env_side(
    make_env: Callable[[int], object],
    make_agent: Callable,
    act: ActFn,
    rollout: Callable | None,
    seed: int,
    num_envs: int,
    worker: int = 0,
) -> EnvSide:
    """Worker `worker`'s side: its N envs seeded seed + worker * N + i, its generator seed +
    worker (worker 0's are the thread backend's)."""
    env_seed = seed + worker * num_envs
    env = make_env(env_seed)
    return EnvSide(env, make_agent(env), act, rollout, seed + worker, env_seed)


def env_side_recipe(
    agent: torch.nn.Module,
    act: ActFn,
    rollout: Callable | None,
    seed: int,
    num_envs: int,
    env=None,
    make_env: Callable[[int], object] | None = None,
    make_agent: Callable | None = None,
) -> SideRecipe:
    """An environments' side for any transport: beside the trainer, over `env` with a CPU copy
    of `agent`; built anew where it runs (when `make_env(seed)` and `make_agent(env)` are
    given: picklable), worker w's as make_env_side seeds it."""

    def beside() -> EnvSide:
        # The rollout side's own copy, on the CPU with the environments. From a GPU trainer this
        # copies the weights to the host once, at construction.
        rollout_agent = copy.deepcopy(agent).cpu()  # sync: one-time copy to the rollout side
        return EnvSide(env, rollout_agent, act, rollout, seed, seed)

    anew = None
    if make_env is not None:
        anew = functools.partial(make_env_side, make_env, make_agent, act, rollout, seed, num_envs)
    return SideRecipe(beside, anew)


def env_slots(backend: str, staleness: int, num_steps: int, layout: dict, pin: bool) -> list[Chunk]:
    """The chunks an environments' transport cycles through (`layout`: envs.layout.slot_layout's).
    Ray's workers fill chunks of their own: two receive them. Shared memory cannot also be
    pinned: only the thread backend's chunks are (`pin`, for a trainer on a GPU)."""
    if backend == "ray":
        return rollout_slots(0, num_steps, **layout)
    return rollout_slots(staleness, num_steps, **layout, pin_memory=pin and backend == "thread")
