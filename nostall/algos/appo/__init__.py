"""Asynchronous PPO (IMPALA-style): the rollout side runs up to `staleness` policy versions
ahead of the trainer, so collecting and learning overlap, and V-trace corrects for the lag.

The update is PPO's clipped surrogate (nostall/algos/ppo/update.py); only the targets differ.
For a chunk collected by behaviour policy mu (version v) and trained on by pi (version
v + lag):
- the critic's targets are V-trace's v_s, with importance weights min(rho_bar, pi / mu) and
  traces min(c_bar, pi / mu) (Espeholt et al. 2018, arXiv:1802.01561);
- the advantages are V-trace's policy-gradient advantages, already weighted by the truncated
  importance ratio;
- the PPO ratio is taken against pi at the start of the update (the "old" policy), whose
  log-probabilities replace the chunk's behaviour ones.
With staleness 0 every chunk is on-policy and V-trace reduces to lambda = 1 returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import nostall
from nostall.algos.ppo import PPOConfig, PPOResult, PPOTrainer, Targets, bootstrap_values
from nostall.algos.ppo.agent import ActorCritic, log_prob_entropy
from nostall.runtime.storage import Chunk
from nostall.train.loop import LogFn
from nostall.train.names import refuses_unknown_names


@refuses_unknown_names
@dataclass
class APPOConfig(PPOConfig):
    """PPOConfig with APPO's defaults and V-trace's clips (`nostall train appo --rho-bar 1`).
    On the thread backend the native rollout releases the GIL, so the two sides overlap; a
    rollout stepped from Python (--no-native-rollout) holds it: --backend process shares none."""

    staleness: int = 1
    """how many policy versions the rollout side may run ahead of the trainer"""
    rho_bar: float = 1.0
    """V-trace: clip of the importance weight in the TD error and the policy gradient"""
    c_bar: float = 1.0
    """V-trace: clip of the trace-cutting weight"""


@torch.no_grad()
def vtrace_advantages(agent: ActorCritic, chunk: Chunk, args: APPOConfig) -> Targets:
    """Advantages and value targets by V-trace, from the current (target) policy and critic;
    the chunk is left as it was collected."""
    obs = chunk.obs[:-1]
    # (T, N) each: the current policy and critic, not the stale behaviour ones
    out, value = agent.logits_value(obs)
    target_log_prob, _ = log_prob_entropy(out, chunk.actions, agent.log_std)
    done, next_value = bootstrap_values(agent, chunk, value)
    value_target, pg_advantage = nostall.vtrace(
        chunk.log_probs,
        target_log_prob,
        chunk.rewards.float() * args.reward_scale,
        value,
        next_value,
        done,
        chunk.terminated,
        args.gamma,
        args.rho_bar,
        args.c_bar,
    )
    # The PPO ratio and the clipped value loss are relative to the policy and critic at the
    # start of this update.
    return Targets(pg_advantage, value_target, target_log_prob, value)


class APPOTrainer(PPOTrainer):
    """PPOTrainer with V-trace targets: `APPOTrainer(env="CartPole-v1", args=APPOConfig())`."""

    algorithm = "appo"
    advantage_fn = staticmethod(vtrace_advantages)

    def __init__(self, env=None, args: APPOConfig | None = None):
        super().__init__(env, APPOConfig() if args is None else args)


def train(args: APPOConfig, log: LogFn | None = None) -> PPOResult:
    """`APPOTrainer(args=args).train(log)`."""
    return APPOTrainer(args=args).train(log)


__all__ = ["APPOConfig", "APPOTrainer", "train", "vtrace_advantages"]
