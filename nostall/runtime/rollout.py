"""The rollout side: steps the native environments with a policy copy, writing each step
straight into a preallocated chunk, and hands filled chunks to the trainer side.

A chunk is collected either step by step from Python (`act`, any policy), or in one native call
(`rollout`, a policy the native rollout knows: see nostall.algos.ppo.agent.native_rollout)."""

from __future__ import annotations

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
    episodes: EpisodeTracker | None,
    rollout: RolloutFn | None = None,
) -> None:
    """Fills `chunk` with T steps starting from `first_obs` (N, obs_dim): with `rollout` in one
    call, else one `act` and one environment step at a time. `episodes`, when given, counts
    the chunk's episodes (the runtimes count them on the trainer's side instead)."""
    chunk.obs[0].copy_(first_obs)
    if rollout is not None:
        rollout(env, chunk, generator)
    elif len(getattr(env.torch, "groups", ())) == 2:
        _collect_pipelined(env, act, chunk, generator)
    else:
        _collect_steps(env, act, chunk, generator)
    if episodes is not None:  # the chunk's episode statistics in one op
        episodes.update(chunk.rewards, chunk.terminated | chunk.truncated)


def _collect_steps(env: VectorEnv, act: ActFn, chunk: Chunk, generator: torch.Generator) -> None:
    step_env = env.torch
    for t in range(chunk.num_steps):
        env_action, action, log_prob, value = act(chunk.obs[t], generator)
        chunk.actions[t].copy_(action)
        chunk.log_probs[t].copy_(log_prob)
        chunk.values[t].copy_(value)
        step_env.step(env_action, out=_step_rows(chunk, t))


def _step_rows(chunk: Chunk, t: int) -> EnvStep:
    """Where step t's results go: obs[t + 1] and the step's rewards and flags."""
    return EnvStep(
        chunk.obs[t + 1],
        chunk.rewards[t],
        chunk.terminated[t],
        chunk.truncated[t],
        chunk.final_obs[t],
    )


def _collect_pipelined(
    env: VectorEnv, act: ActFn, chunk: Chunk, generator: torch.Generator
) -> None:
    """For an env in two groups stepped asynchronously (`send` returns at once, `recv` waits):
    the policy acts on one group while the other steps, so inference and stepping overlap.

        act A(0), send A | act B(0), send B | recv A(0), act A(1), send A | recv B(0), act B(1) ...

    Each group's rows see exactly the steps a synchronous collection gives them; only the
    order in which the generator's samples are drawn differs."""
    step_env = env.torch
    first, second = step_env.groups

    def act_and_send(t: int, group: int, rows: slice) -> None:
        env_action, action, log_prob, value = act(chunk.obs[t][rows], generator)
        chunk.actions[t][rows].copy_(action)
        chunk.log_probs[t][rows].copy_(log_prob)
        chunk.values[t][rows].copy_(value)
        step_env.send(group, env_action)

    act_and_send(0, 0, first)
    for t in range(chunk.num_steps):
        act_and_send(t, 1, second)  # while the first group steps
        step_env.recv(0, _step_rows(chunk, t).rows(first))
        if t + 1 < chunk.num_steps:
            act_and_send(t + 1, 0, first)  # while the second group steps
        step_env.recv(1, _step_rows(chunk, t).rows(second))
