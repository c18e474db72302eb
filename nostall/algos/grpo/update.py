"""GRPO's update on one generation batch: group-relative advantages, then updates_per_batch
optimizer steps, by explicit adjoints (explicit_update.py) where they apply, else through
autograd. Metrics stay tensors: the loop reads them only every log_interval steps."""

from __future__ import annotations

import torch

import nostall
from nostall.algos.grpo.config import GRPOConfig
from nostall.algos.grpo.explicit_update import explicit_update
from nostall.algos.grpo.loss import grpo_loss, policy_head, policy_log_probs, token_mean
from nostall.lm.decoder import Decoder
from nostall.lm.generation import SampledVocab
from nostall.lm.rollout import LMBatch
from nostall.optim import ClippedAdam

METRICS = ("loss", "clip_fraction", "approx_kl", "kl", "entropy")  # entropy: with a bonus only


def grpo_update(decoder: Decoder, optimizer: ClippedAdam, batch: LMBatch, args: GRPOConfig,
                vocab: SampledVocab | None, reference: Decoder | None, decoupled: bool,
                group_index: torch.Tensor,
                autograd: bool = False) -> dict[str, torch.Tensor]:  # fmt: skip
    """updates_per_batch optimizer steps on one batch; metrics as tensors (not read here).
    By explicit adjoints (nostall/lm/explicit_update.py) where they apply, else through
    autograd (`autograd=True` asks for it: the tests compare the two)."""
    advantage = nostall.group_advantages(batch.rewards, group_index, args.num_prompts,
                                         args.scale_rewards)  # fmt: skip
    explicit = None if autograd else explicit_update(decoder, optimizer, reference)
    G = args.num_generations
    ref_log_prob = None
    if reference is not None:
        with torch.no_grad():
            ref_log_prob = policy_log_probs(reference, batch, args.temperature, vocab, G)
    names = METRICS if args.entropy_coef else METRICS[:-1]  # (entropy: computed with a bonus)
    totals = torch.zeros(len(names), device=batch.rewards.device)
    old_log_prob = None
    for _ in range(args.updates_per_batch):
        if explicit is not None:  # the ops and their adjoints in turn, no autograd graph
            log_prob, loss, clip_fraction, approx_kl, entropy = explicit.step(
                batch, advantage, args, vocab, decoupled, old_log_prob
            )
            kl = torch.zeros_like(loss)  # (no reference: it applies without one)
        else:
            hidden, weight, tokens = policy_head(decoder, batch, args.temperature, vocab, G)
            log_prob = nostall.token_log_prob_linear(hidden, weight, tokens)
            loss, clip_fraction, approx_kl, kl = grpo_loss(
                log_prob, log_prob.detach() if old_log_prob is None else old_log_prob,
                advantage, batch.completion_mask, args,
                batch.log_probs if decoupled else None, ref_log_prob,
            )  # fmt: skip
            entropy = None
            if args.entropy_coef:
                entropy = token_mean(nostall.token_entropy_linear(hidden, weight),
                                     batch.completion_mask)  # fmt: skip
                loss = loss - args.entropy_coef * entropy
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if old_log_prob is None:  # the proximal policy: the weights before this update
            old_log_prob = log_prob.detach()
        values = [loss.detach(), clip_fraction, approx_kl, kl.detach()]
        totals += torch.stack(values if entropy is None else [*values, entropy.detach()])
    return dict(zip(names, (totals / args.updates_per_batch).unbind(), strict=True))
