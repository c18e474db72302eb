"""Token log-probabilities and entropies of a model whose logits are soft-capped (Gemma2's
`final_logit_softcapping`: logits = cap * tanh(hidden @ W.T / cap)), which the chunked native
ops (`token_log_prob_linear`, `token_entropy_linear`: logits = hidden @ W.T) do not compute.

The same contract as those ops: from the final hidden states, a few rows at a time, each
chunk's [rows, V] logits recomputed in the backward (activation checkpointing) rather than
kept, so [B, T, V] logits are never held. Tensor ops under autograd: slower than the native
ops, and only taken for the models that need them.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

Tensor = torch.Tensor

CHUNK_LOGITS = 1 << 22  # logits a chunk holds (16 MiB in float32)


def _logits(hidden: Tensor, weight: Tensor, cap: float, temperature: float) -> Tensor:
    """Float32 soft-capped logits over the temperature of rows `hidden` [n, H] that were
    already divided by it (as GRPO's policy head divides them): cap * tanh(h W / cap) / T."""
    raw = (hidden @ weight.T).float() * temperature  # h W, the model's own logits before the cap
    return torch.tanh(raw / cap) * (cap / temperature)


def _chunk_log_prob(hidden, weight, tokens, cap, temperature) -> Tensor:
    logits = _logits(hidden, weight, cap, temperature)
    return logits.log_softmax(-1).gather(-1, tokens[:, None])[:, 0]


def _chunk_entropy(hidden, weight, cap, temperature) -> Tensor:
    log_p = _logits(hidden, weight, cap, temperature).log_softmax(-1)
    return -(log_p.exp() * log_p).sum(-1)


def _chunked(
    fn, hidden: Tensor, weight: Tensor, *rest: Tensor, cap: float, temperature: float
) -> Tensor:
    shape = hidden.shape[:-1]
    rows = hidden.reshape(-1, hidden.shape[-1])
    flat = [t.reshape(-1) for t in rest]
    step = max(1, CHUNK_LOGITS // max(1, weight.shape[0]))
    outs = []
    for start in range(0, rows.shape[0], step):
        part = slice(start, start + step)
        args = (rows[part], weight, *(t[part] for t in flat), cap, temperature)
        if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
            outs.append(checkpoint(fn, *args, use_reentrant=False))
        else:
            outs.append(fn(*args))
    return torch.cat(outs).view(shape) if outs else rows.new_zeros(shape, dtype=torch.float32)


def softcapped_token_log_prob(
    hidden: Tensor, weight: Tensor, tokens: Tensor, cap: float, temperature: float = 1.0
) -> Tensor:
    """[...] float32 log-probabilities of `tokens` [...] under the soft-capped logits of
    `hidden` [..., H] (divided by the temperature beforehand) and `weight` [V, H]."""
    if not cap > 0:
        raise ValueError(f"cap must be positive, got {cap}")
    return _chunked(_chunk_log_prob, hidden, weight, tokens, cap=cap, temperature=temperature)


def softcapped_token_entropy(
    hidden: Tensor, weight: Tensor, cap: float, temperature: float = 1.0
) -> Tensor:
    """[...] float32 entropies of the soft-capped distributions (see softcapped_token_log_prob)."""
    if not cap > 0:
        raise ValueError(f"cap must be positive, got {cap}")
    return _chunked(_chunk_entropy, hidden, weight, cap=cap, temperature=temperature)
