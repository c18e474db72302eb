"""Rollout and training that overlap on native environments: the rollout loop of
nostall.runtime.loop (a thread, bounded queues of preallocated chunks, policy-version tags, a
staleness bound, double-buffered weights), filling time-major chunks with environment steps.

    runtime = Runtime(env, agent, act, num_steps=128, staleness=1, seed=0)
    with runtime:
        for _ in range(iterations):
            slot, chunk = runtime.next_chunk()    # collected by version chunk.version
            ...update agent on chunk...
            runtime.release(slot)
            with runtime.boundary():               # only when checkpointing
                runtime.publish(agent)             # the next version, for the rollout side
                state = runtime.state_dict()

Staleness bound S: chunk k is collected by a policy of version at least k - S (the trainer
publishes version v after its v-th update). S = 0 alternates strictly: exactly synchronous
PPO. The trainer may publish its weights only every K updates (`publish(agent, weights=False)`
in between): the bound still counts updates. A failure on either side reaches the other within
a poll interval, with its traceback; leaving the context joins the rollout thread.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import torch

from nostall.envs import VectorEnv
from nostall.runtime.device import pinned
from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.loop import RolloutLoop
from nostall.runtime.rollout import ActFn, collect
from nostall.runtime.storage import Chunk, rollout_slots, slot_layout


class Runtime:
    def __init__(
        self,
        env: VectorEnv,
        agent: torch.nn.Module,
        act: ActFn,
        *,
        num_steps: int,
        staleness: int = 0,
        seed: int = 0,
        join_timeout_s: float = 10.0,
        rollout: Callable | None = None,
    ):
        """`act(agent, obs, generator)` steps the policy; `rollout(agent, env, chunk,
        generator)`, when given, collects a whole chunk in one call instead."""
        trainer_device = next(agent.parameters()).device
        slots = rollout_slots(
            staleness, num_steps, **slot_layout(env), pin_memory=pinned(trainer_device)
        )
        self.env = env
        # The rollout side's own copy, on the CPU with the environments. From a GPU trainer this
        # copies the weights to the host once, at construction.
        self.rollout_agent = copy.deepcopy(agent).cpu()  # sync: one-time copy to the rollout side
        self._act = functools.partial(act, self.rollout_agent)
        self._rollout = None if rollout is None else functools.partial(rollout, self.rollout_agent)
        self.episodes = EpisodeTracker(env.num_envs)
        self.generator = torch.Generator().manual_seed(seed)
        self._next_obs = env.torch.reset(seed=seed)
        self.loop = RolloutLoop(slots, self._fill, self.rollout_agent, agent,
                                staleness=staleness, join_timeout_s=join_timeout_s)  # fmt: skip
        self.slots, self.timeline, self.staleness = slots, self.loop.timeline, staleness

    def _fill(self, chunk: Chunk) -> None:
        collect(self.env, self._act, chunk, self._next_obs, self.generator, self.episodes,
                self._rollout)  # fmt: skip
        self._next_obs = chunk.obs[-1]  # read by the next chunk, before this slot is reused

    # -- the trainer side: the loop's ----------------------------------------------------------
    def next_chunk(self) -> tuple[int, Chunk]:
        return self.loop.next_chunk()

    def release(self, slot: int) -> None:
        self.loop.release(slot)

    def publish(self, agent: torch.nn.Module, weights: bool = True) -> int:
        return self.loop.publish(agent, weights)

    def lag(self, chunk: Chunk) -> int:
        return self.loop.lag(chunk)

    def boundary(self):
        """Keeps the rollout side between chunks for the block (for a checkpoint)."""
        return self.loop.boundary()

    @property
    def version(self) -> int:
        return self.loop.version

    @property
    def chunks_collected(self) -> int:
        return self.loop.chunks_collected

    # -- checkpoints (inside `boundary()`) -----------------------------------------------------
    def state_dict(self) -> dict:
        """The rollout side's resumable state: environments, generator, next observation,
        episode statistics, the loop's versions and weights, and the chunks not yet trained
        on. The same keys as ProcessRuntime's, so a checkpoint resumes on either backend."""
        return {
            "env": self.env.state_dict(),
            "generator": self.generator.get_state(),
            "next_obs": self._next_obs.clone(),
            "episodes": self.episodes.state_dict(),
            **self.loop.state_dict(chunk_state),
        }

    def load_state_dict(self, state: dict, agent: torch.nn.Module) -> None:
        """Before `start`: restores a state_dict; `agent` (the trainer's, restored first) is
        published as the saved version."""
        self.env.load_state_dict(state["env"])
        self.generator.set_state(state["generator"])
        self._next_obs = state["next_obs"].clone()
        self.episodes.load_state_dict(state["episodes"])
        self.loop.load_state_dict(state, agent, load_chunk_state)

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> Runtime:
        self.loop.start()
        return self

    def close(self) -> None:
        self.loop.close()

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.loop.__exit__(exc_type, exc, tb)


def chunk_state(chunk: Chunk) -> dict:
    """A copy of a filled chunk (for a checkpoint)."""
    return {**{k: v.clone() for k, v in chunk.tensors().items()}, "version": chunk.version}


def load_chunk_state(chunk: Chunk, state: dict) -> None:
    for name, tensor in chunk.tensors().items():
        tensor.copy_(state[name])
    chunk.version = int(state["version"])
