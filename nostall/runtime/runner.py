"""Rollout and training that overlap, the rollout side in a thread: RolloutLoop (loop.py: a
thread, bounded queues of preallocated chunks, policy-version tags, a staleness bound,
double-buffered weights) filled by EnvSide (env_side.py) with environment steps, behind
LoopRuntime's trainer-facing interface (env_runtime.py), as the process and Ray backends are.

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
from collections.abc import Callable

import torch

from nostall.envs import VectorEnv
from nostall.envs.layout import slot_layout
from nostall.runtime.device import pinned
from nostall.runtime.env_runtime import LoopRuntime
from nostall.runtime.env_side import EnvSide
from nostall.runtime.loop import RolloutLoop
from nostall.runtime.rollout import ActFn
from nostall.runtime.storage import rollout_slots


class Runtime(LoopRuntime):
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
        side = EnvSide(env, self.rollout_agent, act, rollout, seed, seed)
        loop = RolloutLoop(
            slots,
            side,
            self.rollout_agent,
            agent,
            staleness=staleness,
            join_timeout_s=join_timeout_s,
        )
        super().__init__(loop, num_workers=1, num_envs=env.num_envs)

    @property
    def chunks_collected(self) -> int:
        return self.loop.chunks_collected
