"""GRPO's loss: the token log-probabilities of the sampling distribution from the final hidden
states (chunked, never [B, T, V] logits), the clipped surrogate aggregated as TRL's
`loss_type`, the decoupled weight for stale tokens, and the optional KL to a reference model."""

from __future__ import annotations

import torch

import nostall
from nostall.algos.grpo.config import AGGREGATIONS, GRPOConfig
from nostall.algos.grpo.config_checks import BEHAVIOUR_MODES
from nostall.lm.batch import LMBatch
from nostall.lm.decoder import Decoder
from nostall.lm.generation import SampledVocab
from nostall.lm.hf_decoder import HFDecoder
from nostall.lm.softcap import softcapped_token_entropy, softcapped_token_log_prob


def policy_log_probs(
    decoder: Decoder,
    batch: LMBatch,
    temperature: float,
    vocab: SampledVocab | None,
    group_size: int,
) -> torch.Tensor:
    """[B, C] log-probabilities of the completion tokens under the sampling distribution (the
    model's, at `temperature`, over the tokens the sampler may draw: `vocab`, None for all);
    each group's prompt is run once."""
    return policy_terms(decoder, batch, temperature, vocab, group_size)[0]


def policy_terms(
    decoder,
    batch: LMBatch,
    temperature: float,
    vocab: SampledVocab | None,
    group_size: int,
    entropy: bool = False,
):
    """(log-probs [B, C], the sampling distribution's entropies [B, C] or None without
    `entropy`) of the completion tokens: policy_head's states, then the chunked head. A
    PolicyTerms module computes them in one call of its own forward."""
    if isinstance(decoder, PolicyTerms):
        return decoder(batch, temperature, vocab, group_size, entropy)
    hidden, weight, tokens = policy_head(decoder, batch, temperature, vocab, group_size)
    log_prob = head_log_probs(decoder, hidden, weight, tokens, temperature)
    entropies = head_entropy(decoder, hidden, weight, temperature) if entropy else None
    return log_prob, entropies


class PolicyTerms(torch.nn.Module):
    """policy_terms as one module's forward, over a model's own forward (HFDecoder): what
    FSDP2 shards as its root, since a sharded module's parameters are whole only inside its
    forward (and backward), and the output weight is read beside the base model's call."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.decoder = HFDecoder(model, static_cache=False)  # (training only: no cache)

    def forward(
        self,
        batch: LMBatch,
        temperature: float,
        vocab: SampledVocab | None,
        group_size: int,
        entropy: bool = False,
    ):
        return policy_terms(self.decoder, batch, temperature, vocab, group_size, entropy)


def head_log_probs(
    decoder: Decoder,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """Float32 log-probs of `tokens` from policy_head's hidden states (over the temperature)
    and output weight, in chunks: the native op, or for a model whose logits are soft-capped
    (Gemma2) the same chunks in tensor ops with the cap."""
    if decoder.softcap:
        return softcapped_token_log_prob(hidden, weight, tokens, decoder.softcap, temperature)
    # (float32 whatever the compute dtype: the ratios are differences of log-probs)
    return nostall.token_log_prob_linear(hidden, weight, tokens).float()


def head_entropy(
    decoder: Decoder, hidden: torch.Tensor, weight: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Float32 entropies of the sampling distribution (see head_log_probs)."""
    if decoder.softcap:
        return softcapped_token_entropy(hidden, weight, decoder.softcap, temperature)
    return nostall.token_entropy_linear(hidden, weight).float()


def policy_head(
    decoder: Decoder,
    batch: LMBatch,
    temperature: float,
    vocab: SampledVocab | None,
    group_size: int,
):
    """(hidden [B, C, H] over the temperature, output weight [V', H], tokens [B, C] in [0, V'))
    of the sampling distribution at the completion tokens, V' the tokens the sampler may draw:
    the arguments of token_log_prob_linear (and token_entropy_linear)."""
    hidden = (
        decoder.grouped_hidden(
            batch.prompt_ids[::group_size],
            batch.prompt_mask[::group_size],
            batch.completion_ids,
            batch.completion_mask,
        )
        / temperature
    )  # (B, C, H): the states that predict the completion tokens
    weight, tokens = decoder.output_weight, batch.completion_ids
    # The native decoder's states are float32 over bf16 weights too: the head in the weights'.
    hidden = hidden.to(weight.dtype)
    if vocab is not None:  # the softmax over the allowed tokens' rows only
        weight, tokens = weight[vocab.ids], vocab.index[tokens]
    return hidden, weight, tokens


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, max_tokens: int
) -> torch.Tensor:
    """A [B, C] per-token quantity reduced as the loss type reduces the surrogate."""
    m = mask.to(per_token.dtype)
    if loss_type == "grpo":
        return ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()
    if loss_type == "dr_grpo":
        return (per_token * m).sum() / (per_token.shape[0] * max_tokens)
    return (per_token * m).sum() / m.sum().clamp(min=1)


def token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A [B, C] per-token quantity's mean over the unmasked tokens of the batch (the entropy
    bonus's reduction whatever the loss type, as TRL's `entropy_coef`)."""
    m = mask.to(per_token.dtype)
    return (per_token * m).sum() / m.sum().clamp(min=1)


# clipped_policy_loss's cap where the weight is taken here (behaviour_for_loss): no bound.
NO_CAP = 1e30


def behaviour_weights(
    old_log_prob: torch.Tensor, behavior_log_prob: torch.Tensor, mask: torch.Tensor, args
) -> torch.Tensor:
    """[B, C] weights of the tokens for the policy that generated them (TRL's
    vllm_importance_sampling_ratio): the ratio of the proximal policy's probability to the
    behaviour's, of each token or of the completion (the product over its tokens, for each of
    them), clamped to [vllm_importance_sampling_clip_min, is_cap] (truncate) or zero outside
    them (mask); a bound None is none."""
    mode = args.vllm_importance_sampling_mode
    if mode not in BEHAVIOUR_MODES:
        raise ValueError(f"vllm_importance_sampling_mode {mode!r} is not one of {BEHAVIOUR_MODES}")
    low, high = args.vllm_importance_sampling_clip_min, args.is_cap
    difference = torch.nan_to_num((old_log_prob - behavior_log_prob) * mask, nan=0.0)
    if mode.startswith("sequence"):
        difference = difference.sum(-1, keepdim=True)
    ratio = difference.exp()
    if mode.endswith("truncate"):
        if low is not None or high is not None:
            ratio = ratio.clamp(min=low, max=high)
    else:
        outside = torch.zeros_like(ratio, dtype=torch.bool)
        if low is not None:
            outside |= ratio < low
        if high is not None:
            outside |= ratio > high
        ratio = ratio.masked_fill(outside, 0.0)
    return ratio.expand_as(old_log_prob)


def behaviour_for_loss(
    old_log_prob: torch.Tensor, behavior_log_prob: torch.Tensor, mask: torch.Tensor, args
) -> tuple[torch.Tensor, float]:
    """(behavior_log_prob, is_cap) for clipped_policy_loss, whose weight is
    min(exp(old_log_prob - behavior_log_prob), is_cap): as given for token_truncate with no
    lower bound (the op's own weight, exactly), else log-probs shifted so that the op's weight
    is behaviour_weights' (a weight of 0 by a shift past float32's exp, which gives exactly 0)."""
    if (
        args.vllm_importance_sampling_mode == "token_truncate"
        and args.vllm_importance_sampling_clip_min is None
        and args.is_cap is not None
    ):
        return behavior_log_prob, float(args.is_cap)
    weight = behaviour_weights(old_log_prob, behavior_log_prob, mask, args)
    shifted = old_log_prob - weight.clamp(min=1e-30, max=NO_CAP).log()
    return torch.where(weight > 0, shifted, old_log_prob + 1e4), NO_CAP


def grpo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    args: GRPOConfig,
    behavior_log_prob: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
):
    """(loss, clip_fraction, approx_kl, kl) of [B, C] token log-probs: the clipped surrogate
    aggregated as `args.loss_type`, weighted by the behaviour weight (behaviour_weights) when
    `behavior_log_prob` is given (decoupled objective), plus beta * k3 KL to `ref_log_prob`
    (each token's times its ratio to the proximal policy with use_bias_correction_kl, TRL's)."""
    C = mask.shape[1]
    is_cap = args.is_cap
    if behavior_log_prob is not None:
        behavior_log_prob, is_cap = behaviour_for_loss(old_log_prob, behavior_log_prob, mask, args)
    out = nostall.clipped_policy_loss(
        log_prob,
        old_log_prob,
        advantage,
        mask,
        args.clip_low,
        args.clip_high,
        AGGREGATIONS[args.loss_type],
        C,
        behavior_log_prob=behavior_log_prob,
        is_cap=NO_CAP if is_cap is None else is_cap,
    )
    loss, kl = out.loss, torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    if ref_log_prob is not None:
        delta = ref_log_prob - log_prob
        per_token = delta.exp() - delta - 1
        if args.use_bias_correction_kl:  # (differentiable: its gradient is the point)
            per_token = per_token * (log_prob - old_log_prob).exp()
        kl = aggregate(per_token, mask, args.loss_type, C)
        loss = loss + args.beta * kl
    return loss, out.clip_fraction, out.approx_kl, kl


def clip_ratios(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    args: GRPOConfig,
) -> list[torch.Tensor]:
    """TRL's clip_ratio figures of one micro-batch, in update.CLIP_RATIOS' order: the tokens
    whose ratio to the proximal policy is past the clip on the side its advantage pushes
    (below 1 - clip_low with a negative advantage: low; above 1 + clip_high with a positive
    one: high; either: region) as shares of the loss's tokens, and the smallest completion's
    share of low-clipped tokens and the largest of high-clipped (over the completions with
    tokens; NaN where none has). Tensors: nothing is read."""
    clip_high = args.clip_low if args.clip_high is None else args.clip_high
    ratio = (log_prob - old_log_prob).exp()
    sign = advantage.reshape(-1, 1)
    low = (ratio < 1 - args.clip_low) & (sign < 0)
    high = (ratio > 1 + clip_high) & (sign > 0)
    m = mask.to(ratio.dtype)
    tokens, row_tokens = m.sum().clamp(min=1), m.sum(1)
    rows = row_tokens > 0
    none = torch.full_like(tokens, float("nan"))

    def share(x: torch.Tensor) -> torch.Tensor:
        return (x.to(m.dtype) * m).sum() / tokens

    def row_shares(x: torch.Tensor) -> torch.Tensor:
        return (x.to(m.dtype) * m).sum(1) / row_tokens.clamp(min=1)

    low_min = torch.where(rows, row_shares(low), float("inf")).amin()
    high_max = torch.where(rows, row_shares(high), float("-inf")).amax()
    low_min, high_max = (torch.where(rows.any(), v, none) for v in (low_min, high_max))
    return [share(low), low_min, share(high), high_max, share(low | high)]
