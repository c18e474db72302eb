"""GRPO's update on one generation batch: group-relative advantages, then updates_per_batch
passes over it in micro-batches of whole prompt groups, an optimizer step every
gradient_accumulation_steps of them; by explicit adjoints (explicit_update.py) where they
apply, else through autograd. Metrics stay tensors: the loop reads them only every
log_interval steps."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

import nostall
from nostall.algos.grpo.config import AGGREGATIONS, GRPOConfig
from nostall.algos.grpo.explicit_update import MicroBatch, explicit_update
from nostall.algos.grpo.loss import (
    behaviour_weights,
    clip_ratios,
    grpo_loss,
    policy_log_probs,
    policy_terms,
    token_mean,
)
from nostall.lm.batch import LMBatch
from nostall.lm.decoder import Decoder
from nostall.lm.generation import SampledVocab
from nostall.lm.precision import MasterWeights
from nostall.optim import ClippedAdam

Tensor = torch.Tensor
METRICS = ("loss", "clip_fraction", "approx_kl", "kl", "entropy")
# Measured (TRL's figures past the loss's own): the gradient norm, the entropy without a bonus
# (one more pass over the vocabulary) and the clipped tokens by side.
CLIP_RATIOS = (
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
)


def ended_rows(batch: LMBatch, eos_token_id: int) -> torch.Tensor:
    """[B] bool: the completions that ended with <eos> (not cut off by max_new_tokens); on the
    batch's device, no host read."""
    lengths = batch.completion_mask.sum(1)
    last = batch.completion_ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
    return (lengths > 0) & (last == eos_token_id)


def micro_batches(batch: LMBatch, count: int) -> list[LMBatch]:
    """The batch's rows in `count` equal runs of whole prompt groups (views, no copies)."""
    if count == 1:
        return [batch]
    rows = batch.completion_ids.shape[0] // count
    return [
        dataclasses.replace(
            batch, **{name: t[i * rows : (i + 1) * rows] for name, t in batch.tensors().items()}
        )
        for i in range(count)
    ]


def rank_rows(tensor: torch.Tensor, count: int, rank: tuple[int, int]) -> torch.Tensor:
    """Rank r of M's rows of a batch tensor: its r-th M-th of each of the `count` micro-batches,
    in order (so its own micro-batches are its shares of the whole batch's)."""
    r, M = rank
    rows = tensor.shape[0] // count
    share = rows // M
    return torch.cat(
        [tensor[i * rows + r * share : i * rows + (r + 1) * share] for i in range(count)]
    )


def rank_weights(loss_mask: torch.Tensor, count: int, rank: tuple[int, int], loss_type: str):
    """Per micro-batch, the factors (loss, token mean) by which a rank's share of a loss
    averaged over the ranks becomes the whole micro-batch's: M x its share of the tokens for a
    mean over the micro-batch's tokens (its own mean is over its own), 1 for a mean over rows
    (equal shares). Device tensors: nothing is read."""
    M = rank[1]
    tokens = loss_mask.sum(1).float()
    whole = tokens.view(count, -1).sum(1).clamp(min=1)
    own = rank_rows(tokens, count, rank).view(count, -1).sum(1)
    token_factor = M * own / whole
    if AGGREGATIONS[loss_type] == "token_mean":
        return list(zip(token_factor.unbind(), token_factor.unbind(), strict=True))
    return [(1.0, f) for f in token_factor.unbind()]


@dataclass(frozen=True)
class UpdateContext:
    """What every update of a run reads besides its batch: the model's forward, what steps it
    (the optimizer, or the master weights around it), the settings, the sampler's vocabulary and
    the batch's prompt groups; and, where they apply, the frozen reference model, <eos> (for
    mask_truncated_completions), what each optimizer step runs inside (`writing`: a generation
    side that reads these very weights waits for it, and it for generation), this trainer
    rank's place (r, M) among M data-parallel ranks, and `autograd` (asked for by the tests that
    compare it with the explicit adjoints)."""

    decoder: Decoder
    optimizer: ClippedAdam | MasterWeights
    args: GRPOConfig
    vocab: SampledVocab | None
    group_index: torch.Tensor
    reference: Decoder | None = None
    eos_token_id: int | None = None
    writing: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    rank: tuple[int, int] = (0, 1)
    autograd: bool = False


def grpo_update(
    context: UpdateContext, batch: LMBatch, decoupled: bool, measure: bool = True
) -> dict[str, Tensor]:
    """updates_per_batch passes over one batch; metrics as tensors (not read here), means over
    the micro-batches. By explicit adjoints where they apply, else through autograd. With M
    trainer ranks whose optimizer averages their gradients, this one trains on its share of
    every micro-batch (whole prompt groups; advantages from the whole batch), its losses
    weighted so that the average is the whole micro-batch's gradient. `decoupled`: the loss
    weighs each token by the behaviour ratio (setup.corrects_behaviour). `measure`: TRL's
    figures too (grad_norm of the last optimizer step, the entropy without a bonus, the clip
    ratios), for a step whose metrics are read; without it, the loss's own (and the entropy
    where the bonus computes it)."""
    decoder, optimizer, args = context.decoder, context.optimizer, context.args
    vocab, reference, rank = context.vocab, context.reference, context.rank
    advantage = nostall.group_advantages(
        batch.rewards, context.group_index, args.num_prompts, args.scale_rewards
    )
    loss_mask = batch.loss_mask
    if args.mask_truncated_completions:
        if context.eos_token_id is None:
            raise ValueError("mask_truncated_completions needs the model's eos_token_id")
        loss_mask = loss_mask & ended_rows(batch, context.eos_token_id)[:, None]
    # (Ranks train through autograd: their forward is the sharded module's.)
    explicit = None
    if not context.autograd and rank[1] == 1:
        explicit = explicit_update(decoder, optimizer, reference, batch.completion_ids.shape[1])
    G, count = args.num_generations, args.micro_batches
    weights = [(1.0, 1.0)] * count
    share = 1.0  # this rank's tokens over the mean rank's (the behaviour figures' weight)
    if rank[1] > 1:
        weights = rank_weights(loss_mask, count, rank, args.loss_type)
        mask = batch.loss_mask
        share = rank[1] * rank_rows(mask, count, rank).sum() / mask.sum().clamp(min=1)
        batch = dataclasses.replace(
            batch, **{name: rank_rows(t, count, rank) for name, t in batch.tensors().items()}
        )
        advantage, loss_mask = rank_rows(advantage, count, rank), rank_rows(loss_mask, count, rank)
    accumulate = args.gradient_accumulation_steps
    parts = micro_batches(batch, count)
    rows = batch.completion_ids.shape[0] // count
    advantages, masks = advantage.split(rows), loss_mask.split(rows)
    ref_log_probs = [None] * count
    if reference is not None:
        with torch.no_grad():
            ref_log_probs = [
                policy_log_probs(reference, p, args.temperature, vocab, G) for p in parts
            ]
    # The proximal policy: the weights before this batch's first optimizer step. With one
    # step a pass, each micro-batch's first pass gives its log-probs; with more, a
    # micro-batch after the first step needs them taken beforehand (TRL's old_per_token_logps).
    old_log_probs: list[torch.Tensor | None] = [None] * count
    if count > accumulate:
        with torch.no_grad():
            old_log_probs = [
                policy_log_probs(decoder, p, args.temperature, vocab, G) for p in parts
            ]
    entropy = bool(args.entropy_coef) or measure
    names = METRICS if entropy else METRICS[:-1]
    names += CLIP_RATIOS if measure else ()
    totals = torch.zeros(len(names), device=batch.rewards.device)
    passes = _Passes(context, explicit, decoupled, old_log_probs, 1.0 / accumulate, measure)
    grad_norm = None
    for update in range(args.updates_per_batch):
        for i, part in enumerate(parts):
            step = _Part(
                i,
                part,
                advantages[i],
                masks[i],
                ref_log_probs[i],
                first_of_step=i % accumulate == 0,
                weights=weights[i],
            )
            values = _micro_batch(passes, step)
            if (i + 1) % accumulate == 0:
                # (the norm of the batch's last optimizer step alone: the one logged)
                last = update == args.updates_per_batch - 1 and i == count - 1
                with context.writing():
                    grad_norm = optimizer.apply_gradients(measure=measure and last)
            totals += torch.stack(values)
    totals /= args.updates_per_batch * count
    metrics = dict(zip(names, totals.unbind(), strict=True))
    if grad_norm is not None:  # (transformers': the logged step's, its last optimizer step's)
        metrics["grad_norm"] = grad_norm
    metrics.update(behaviour_mismatch(torch.cat(old_log_probs), batch, args, share))
    return metrics


def behaviour_mismatch(
    trainer: torch.Tensor, batch: LMBatch, args, share: float | torch.Tensor = 1.0
) -> dict:
    """How far generation's log-probs of the completion tokens are from the trainer's at the
    batch's first step (its proximal policy), under TRL's names: |difference| mean and max,
    and the behaviour weight (loss.behaviour_weights: the weight the decoupled objective and
    the engine correction apply) min, mean and max over the tokens (0 with none). Tensors:
    nothing is read here. The means are weighted by `share` (a trainer rank's tokens over the
    mean rank's)."""
    mask = batch.loss_mask
    count = mask.sum().clamp(min=1)
    delta = trainer - batch.log_probs
    ratio = behaviour_weights(trainer, batch.log_probs, mask, args)
    zero = torch.zeros((), dtype=delta.dtype, device=delta.device)
    gap = torch.where(mask, delta.abs(), zero)
    masked_ratio = torch.where(mask, ratio, zero)
    lowest = torch.where(mask, ratio, float("inf")).amin()
    return {
        "sampling/sampling_logp_difference/mean": share * gap.sum() / count,
        "sampling/sampling_logp_difference/max": gap.amax(),
        "sampling/importance_sampling_ratio/min": torch.where(mask.any(), lowest, zero),
        "sampling/importance_sampling_ratio/mean": share * masked_ratio.sum() / count,
        "sampling/importance_sampling_ratio/max": masked_ratio.amax(),
    }


@dataclass
class _Passes:
    """What every micro-batch of an update shares: the context, the explicit adjoints (None:
    autograd), whether the loss is decoupled, the proximal log-probs (filled on each micro-batch's
    first pass), each micro-batch's share of an optimizer step's gradient and whether TRL's
    figures are measured (grpo_update's `measure`)."""

    context: UpdateContext
    explicit: object | None
    decoupled: bool
    old_log_probs: list[torch.Tensor | None]
    scale: float
    measure: bool = False


@dataclass
class _Part:
    """One micro-batch: its index, rows, advantages, loss mask, reference log-probs, whether it
    begins an optimizer step, and `weights`, the factors of its loss and of its token means in
    the gradient (a trainer rank's, rank_weights; the metrics are its own share's)."""

    i: int
    part: LMBatch
    advantage: torch.Tensor
    loss_mask: torch.Tensor
    ref_log_prob: torch.Tensor | None
    first_of_step: bool
    weights: tuple = (1.0, 1.0)


def _micro_batch(passes: _Passes, step: _Part) -> list[torch.Tensor]:
    """One micro-batch's gradients, times the pass's scale, added to the optimizer's (set, on
    the first of an optimizer step); returns its metrics. Fills old_log_probs[i] on its first
    pass."""
    optimizer, args, vocab = passes.context.optimizer, passes.context.args, passes.context.vocab
    explicit, decoupled, old_log_probs, scale = (
        passes.explicit,
        passes.decoupled,
        passes.old_log_probs,
        passes.scale,
    )
    i, part, advantage, loss_mask = step.i, step.part, step.advantage, step.loss_mask
    ref_log_prob, first_of_step, weights = step.ref_log_prob, step.first_of_step, step.weights
    decoder = passes.context.decoder
    old_log_prob = old_log_probs[i]
    measure = passes.measure
    if explicit is not None:  # the ops and their adjoints in turn, no autograd graph
        micro = MicroBatch(part, advantage, loss_mask, old_log_prob, scale, not first_of_step)
        log_prob, loss, clip_fraction, approx_kl, entropy = explicit.gradients(
            micro, args, vocab, decoupled, measure
        )
        kl = torch.zeros_like(loss)  # (no reference: it applies without one)
        optimizer.collect_gradients()  # (master weights: into their float32 sum)
        token_weight = 1.0
    else:
        G = args.num_generations
        log_prob, entropies = policy_terms(
            decoder, part, args.temperature, vocab, G, bool(args.entropy_coef) or measure
        )
        loss, clip_fraction, approx_kl, kl = grpo_loss(
            log_prob,
            log_prob.detach() if old_log_prob is None else old_log_prob,
            advantage,
            loss_mask,
            args,
            part.log_probs if decoupled else None,
            ref_log_prob,
        )
        loss_weight, token_weight = weights
        objective = loss * loss_weight
        entropy = None
        if args.entropy_coef:
            entropy = token_mean(entropies, loss_mask)
            loss = loss - args.entropy_coef * entropy
            objective = objective - args.entropy_coef * token_weight * entropy
        elif measure:  # (measured, not trained on)
            entropy = token_mean(entropies.detach(), loss_mask)
        if first_of_step:
            optimizer.zero_grad()
        (objective * scale).backward()
        optimizer.collect_gradients()  # (master weights: into their float32 sum)
        # A rank's metrics weighted as its loss is: the ranks' mean is the whole micro-batch's.
        loss, kl = objective, kl * loss_weight
        clip_fraction, approx_kl = clip_fraction * token_weight, approx_kl * token_weight
        entropy = None if entropy is None else entropy * token_weight
    if old_log_prob is None:  # the proximal policy: the weights before this update
        old_log_probs[i] = log_prob.detach()
    values = [loss.detach(), clip_fraction, approx_kl, kl.detach()]
    if entropy is not None:
        values.append(entropy.detach())
    if measure:
        low, low_min, high, high_max, region = clip_ratios(
            log_prob.detach(), old_log_probs[i], advantage, loss_mask, args
        )
        # A rank's shares weighted as its loss is; its extremes are its own (min / max over
        # the ranks, of each rank's mean over its micro-batches).
        values += [low * token_weight, low_min, high * token_weight, high_max]
        values.append(region * token_weight)
    return values
