"""Rollout and training that overlap: a rollout thread and the trainer (the caller's thread)
joined by bounded queues of preallocated chunks, with policy-version tags, a staleness bound
and double-buffered weight sync.

    runtime = Runtime(env, agent, act, num_steps=128, staleness=1, seed=0)
    with runtime:
        for _ in range(iterations):
            chunk = runtime.next_chunk()     # (slot, chunk) collected by version chunk.version
            ...update agent on chunk...
            runtime.release(chunk)
            runtime.publish(agent)            # the next version, for the rollout side

Staleness bound S: chunk k is collected by a policy of version at least k - S (the trainer
publishes version v after its v-th update). S = 0 alternates strictly: exactly synchronous
PPO. The trainer may publish its weights only every K updates (`publish(agent, weights=False)`
in between): the bound still counts updates, and a chunk's policy may then also lag by up to
K - 1 more. A failure on either side reaches the other within a poll interval, with its traceback;
leaving the context joins the rollout thread.
"""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections.abc import Callable

import torch

from nostall.envs import VectorEnv
from nostall.runtime.device import pinned
from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.queue import BoundedQueue, RuntimeStopped, SideChannel
from nostall.runtime.rollout import ActFn, Timeline, collect
from nostall.runtime.storage import Chunk, rollout_slots, slot_layout
from nostall.runtime.weights import WeightBuffer


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
        self.slots = rollout_slots(
            staleness, num_steps, **slot_layout(env), pin_memory=pinned(trainer_device)
        )
        self.env = env
        self.staleness = staleness
        # The rollout side's own copy, on the CPU with the environments. From a GPU trainer this
        # copies the weights to the host once, at construction.
        self.rollout_agent = copy.deepcopy(agent).cpu()  # sync: one-time copy to the rollout side
        self._act = act
        self._rollout = rollout
        self.weights = WeightBuffer(agent)
        self.version = 0  # the trainer's: number of updates published
        self.rollout_version = 0  # the version the rollout side last pulled
        self.chunks_collected = 0
        self.episodes = EpisodeTracker(env.num_envs)
        self.timeline = Timeline()
        self.channel = SideChannel()
        self.generator = torch.Generator().manual_seed(seed)
        slots = len(self.slots)
        self._free = BoundedQueue(slots, self.channel)
        self._filled = BoundedQueue(slots, self.channel)
        for i in range(slots):
            self._free.put(i)
        self._next_obs = env.torch.reset(seed=seed)
        self._thread: threading.Thread | None = None
        self._join_timeout_s = join_timeout_s

    # -- the rollout side ----------------------------------------------------------------------
    def _rollout_loop(self) -> None:
        try:
            while not self.channel.stop.is_set():
                self.weights.wait_for(self.chunks_collected - self.staleness, self.channel.stop)
                self.channel.check()
                self.rollout_version = self.weights.pull(self.rollout_agent, self.rollout_version)
                slot = self._free.get()
                chunk = self.slots[slot]
                start = time.perf_counter()
                collect(
                    self.env,
                    functools.partial(self._act, self.rollout_agent),
                    chunk,
                    self._next_obs,
                    self.generator,
                    self.episodes,
                    None
                    if self._rollout is None
                    else functools.partial(self._rollout, self.rollout_agent),
                )
                self.timeline.record("rollout", start, time.perf_counter())
                chunk.version = self.rollout_version
                self._next_obs = chunk.obs[-1]
                self.chunks_collected += 1
                self._filled.put(slot)
        except RuntimeStopped:
            pass
        except BaseException as e:  # reaches the trainer with its traceback
            self.channel.fail(e)

    # -- the trainer side ----------------------------------------------------------------------
    def next_chunk(self) -> tuple[int, Chunk]:
        """Blocks for the next filled chunk; raises (with the cause) if the rollout side died."""
        slot = self._filled.get()
        return slot, self.slots[slot]

    def release(self, slot: int) -> None:
        self._free.put(slot)

    def publish(self, agent: torch.nn.Module, weights: bool = True) -> int:
        """Marks one more update done (the next version) and, with `weights`, publishes the
        trainer's weights as that version; returns the version."""
        self.version += 1
        if weights:
            self.weights.publish(agent, self.version)
        else:
            self.weights.advance(self.version)
        return self.version

    def lag(self, chunk: Chunk) -> int:
        """How many versions behind the trainer the chunk's policy is."""
        return self.version - chunk.version

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The rollout side's resumable state. Exact only while that side waits for the next
        version: with staleness 0, between a release and the next publish."""
        return {
            "generator": self.generator.get_state(),
            "next_obs": self._next_obs.clone(),
            "episodes": self.episodes.state_dict(),
            "rollout_weights": self.weights.newest(),  # older than the trainer's between publishes
        }

    def load_state_dict(self, state: dict, agent: torch.nn.Module) -> None:
        """Restores a state_dict; the rollout policy copy gets the weights last published (or
        `agent`'s, from a state without them)."""
        self.rollout_agent.load_state_dict(state.get("rollout_weights", agent.state_dict()))
        self.generator.set_state(state["generator"])
        self._next_obs = state["next_obs"].clone()
        self.episodes.load_state_dict(state["episodes"])

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> Runtime:
        self._thread = threading.Thread(target=self._rollout_loop, name="nostall-rollout")
        self._thread.start()
        return self

    def close(self) -> None:
        self.channel.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._join_timeout_s)
            if self._thread.is_alive():
                raise RuntimeError("the rollout thread did not stop")
            self._thread = None

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        error = self.channel.error
        self.close()
        if exc is None and error is not None:
            raise RuntimeStopped(f"the rollout side failed: {error!r}") from error
