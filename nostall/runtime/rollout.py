"""The rollout side: steps the native environments with a policy copy, writing each step
straight into a preallocated chunk, and hands filled chunks to the trainer side.

A chunk is collected either step by step from Python (`act`, any policy), or in one native call
(`rollout`, a policy the native rollout knows: see nostall.algos.agent.native_rollout)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from nostall.envs import EnvStep, VectorEnv
from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.storage import Chunk

# agent.act(obs, generator) -> (env_action, action, log_prob, value), all without a host sync.
ActFn = Callable[[torch.Tensor, torch.Generator], tuple[torch.Tensor, ...]]
# rollout(env, chunk, generator): fills chunk's T steps after obs[0], in one call.
RolloutFn = Callable[[VectorEnv, Chunk, torch.Generator], None]


@torch.no_grad()
def collect(
    env: VectorEnv,
    act: ActFn,
    chunk: Chunk,
    first_obs: torch.Tensor,
    generator: torch.Generator,
    episodes: EpisodeTracker,
    rollout: RolloutFn | None = None,
) -> None:
    """Fills `chunk` with T steps starting from `first_obs` (N, obs_dim): with `rollout` in one
    call, else one `act` and one environment step at a time."""
    chunk.obs[0].copy_(first_obs)
    if rollout is not None:
        rollout(env, chunk, generator)
    else:
        _collect_steps(env, act, chunk, generator)
    # The chunk's episode statistics in one op (logging reads them only between chunks).
    episodes.update(chunk.rewards, chunk.terminated | chunk.truncated)


def _collect_steps(env: VectorEnv, act: ActFn, chunk: Chunk, generator: torch.Generator) -> None:
    step_env = env.torch
    for t in range(chunk.num_steps):
        env_action, action, log_prob, value = act(chunk.obs[t], generator)
        chunk.actions[t].copy_(action)
        chunk.log_probs[t].copy_(log_prob)
        chunk.values[t].copy_(value)
        rows = EnvStep(
            chunk.obs[t + 1],
            chunk.rewards[t],
            chunk.terminated[t],
            chunk.truncated[t],
            chunk.final_obs[t],
        )
        step_env.step(env_action, out=rows)


class Timeline:
    """(side, start, end) intervals, for the overlap plot."""

    def __init__(self):
        self.origin = time.perf_counter()
        self.spans: list[tuple[str, float, float]] = []

    def record(self, side: str, start: float, end: float) -> None:
        self.spans.append((side, start - self.origin, end - self.origin))
