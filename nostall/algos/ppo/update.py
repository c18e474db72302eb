"""PPO's update: targets by GAE, then clipped-surrogate epochs over minibatches of one chunk.

The targets come from an advantage function (`gae_advantages` here, APPO's V-trace in
nostall/algos/appo/), the update is the same for both. A minibatch's loss (clipped surrogate,
clipped value loss, entropy) is one `nostall.ppo_loss` op for discrete actions
(`ppo_loss_from_log_prob` after the Gaussian's log-probabilities for continuous ones), and the
clip plus Adam step one `ClippedAdam` step. Metrics stay tensors: the loop reads them only
every log_interval steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import nostall
from nostall.algos.ppo.agent import ActorCritic, log_prob_entropy
from nostall.algos.ppo.config import PPOConfig
from nostall.optim import ClippedAdam
from nostall.profiler import allow
from nostall.runtime.storage import Chunk

# The update's statistics, averaged over its minibatches.
METRICS = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")


def bootstrap_values(
    agent: ActorCritic, chunk: Chunk, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(done, next_value): V of the observation after each step. Where the episode goes on,
    that observation is the next step's, whose value is `values[t + 1]` (the critic that gave
    `values`, V(obs[t]) for t < T), so the critic runs only on the chunk's last observation and
    on the last observations of truncated episodes (same-step autoreset puts the next
    episode's first observation in obs[t + 1] there, the last one in final_obs). A terminated
    episode's next value is never read: GAE and V-trace cut the bootstrap there."""
    done = chunk.terminated | chunk.truncated  # (T, N)
    next_value = torch.cat([values[1:], agent.value(chunk.obs[-1:])])
    if chunk.truncated.device.type == "cpu":
        # Host tensors: the truncated rows are read at no cost, and only they are evaluated.
        with allow("the truncated rows of a host chunk (the trainer runs on the CPU)"):
            rows = chunk.truncated.nonzero(as_tuple=True)  # sync: none, host tensors
            if len(rows[0]):
                next_value[rows] = agent.value(chunk.final_obs[rows])
    else:
        # On a device: fixed shapes, no host sync; the critic over every final_obs row.
        next_value = torch.where(chunk.truncated, agent.value(chunk.final_obs), next_value)
    return done, next_value


@dataclass
class Targets:
    """What the PPO update trains a chunk towards, all (T, N)."""

    advantage: torch.Tensor
    value_target: torch.Tensor
    old_log_prob: torch.Tensor  # the policy the ratio is taken against
    old_value: torch.Tensor  # the critic the value clip is taken against


@torch.no_grad()
def gae_advantages(agent: ActorCritic, chunk: Chunk, args: PPOConfig) -> Targets:
    """Advantages and value targets by GAE, for chunks from the current policy, with the
    rollout's values (the same critic, at staleness 0)."""
    done, next_value = bootstrap_values(agent, chunk, chunk.values)
    advantage, value_target = nostall.gae(
        chunk.rewards.float() * args.reward_scale,
        chunk.values,
        next_value,
        done,
        chunk.terminated,
        args.gamma,
        args.gae_lambda,
    )
    return Targets(advantage, value_target, chunk.log_probs, chunk.values)


AdvantageFn = Callable[[ActorCritic, Chunk, Any], Targets]


def ppo_update(
    agent: ActorCritic,
    optimizer: ClippedAdam,
    chunk: Chunk,
    targets: Targets,
    args: PPOConfig,
    generator: torch.Generator,
    rank: tuple[int, int] = (0, 1),
) -> dict[str, torch.Tensor]:
    """Clipped-surrogate epochs over one chunk. Returns metrics as tensors (not read here).
    `rank` (r, M) of M data-parallel trainers: this one trains on its 1/M of each minibatch
    (the same permutation on every rank: the same generator) and the optimizer averages the
    gradients (nostall.runtime.distributed)."""
    T, N = chunk.num_steps, chunk.log_probs.shape[1]
    b_obs = chunk.obs[:-1].reshape(T * N, -1)
    b_actions = chunk.actions.reshape(T * N, *chunk.actions.shape[2:])
    # The per-sample float targets side by side, so a minibatch gathers them in one op.
    per_sample = (targets.old_log_prob, targets.old_value, targets.advantage, targets.value_target)
    b_targets = torch.stack([t.reshape(-1) for t in per_sample])  # (4, T * N)
    minibatch = T * N // args.num_minibatches
    totals = torch.zeros(len(METRICS), device=b_obs.device)
    for _ in range(args.update_epochs):
        order = torch.randperm(T * N, generator=generator, device=generator.device)
        for start in range(0, T * N, minibatch):
            idx = order[start : start + minibatch]
            if rank[1] > 1:
                idx = _shard(idx, *rank)
            loss, stats = minibatch_loss(
                agent, b_obs[idx], b_actions[idx], *b_targets[:, idx], args
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()  # clips the gradients' global norm to max_grad_norm first
            totals += stats
    totals /= args.update_epochs * args.num_minibatches
    return dict(zip(METRICS, totals.unbind(), strict=True))


def minibatch_loss(
    agent: ActorCritic,
    obs: torch.Tensor,
    actions: torch.Tensor,
    old_log_prob: torch.Tensor,
    old_value: torch.Tensor,
    adv: torch.Tensor,
    value_target: torch.Tensor,
    args: PPOConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, stats [5] in METRICS order) of one minibatch."""
    value_clip = args.clip_coef if args.clip_vloss else None
    logits, new_value = agent.logits_value(obs)  # one pass of a shared torso (the CNN's)
    if agent.discrete:  # the whole loss in one native op, forward and backward
        out = nostall.ppo_loss(
            logits,
            actions,
            new_value,
            old_log_prob,
            old_value,
            adv,
            value_target,
            args.clip_coef,
            value_clip,
            args.ent_coef,
            args.vf_coef,
            args.norm_adv,
        )
        return out.loss, out.stats.detach()
    # Any other policy: its log-probabilities and entropies from its distribution, the rest of
    # the loss in one native op.
    new_log_prob, entropy = log_prob_entropy(logits, actions, agent.log_std)
    out = nostall.ppo_loss_from_log_prob(
        new_log_prob,
        entropy,
        new_value,
        old_log_prob,
        old_value,
        adv,
        value_target,
        args.clip_coef,
        value_clip,
        args.ent_coef,
        args.vf_coef,
        args.norm_adv,
    )
    return out.loss, out.stats.detach()


def _shard(indices: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s contiguous 1/world of a minibatch's indices."""
    size = len(indices) // world
    return indices[rank * size : (rank + 1) * size]
