"""Token sampling for language-model generation as a native operator.

:func:`sample_tokens` is one decode step's sampler: temperature, top-k and top-p truncation and
a Gumbel-max draw from the caller's generator, the token's log-probability under the policy
before truncation (the behaviour log-prob an off-policy correction compares with the trainer's,
which computes the same from the same logits), and the finished mask
updated in place at `<eos>`, all on the logits' device with no host read, so a decode loop can
run (and be captured) without a sync per token.
"""

import torch

from nostall import _native  # noqa: F401  (loads the native library first)
from nostall.ops.advantages import _scalar

Tensor = torch.Tensor
_sample_tokens_op = torch.ops.nostall.sample_tokens.default


def sample_tokens(
    logits: Tensor,
    finished: Tensor,
    allowed: Tensor,
    *,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    uniform: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(token, log_prob): one token per row of `[B, V]` logits.

    Args:
        logits: `[B, V]` float32/float64 next-token logits (not differentiated: the sampler's
            log-prob is a behaviour constant).
        finished: bool `[B]`, rows already done; they get `pad_token_id` and log-prob 0, and
            rows that sample `eos_token_id` are set True in place.
        allowed: bool `[V]`, the tokens that may be sampled (keep special tokens other than
            `<eos>` out of completions).
        temperature: > 0; the logits are divided by it.
        top_k: keep the k largest (ties at the k-th value kept); 0: all.
        top_p: then keep the smallest set of the largest whose mass reaches top_p; 1: all.
        generator / uniform: the noise is `torch.rand([B, V])` from `generator` on the logits'
            device, or `uniform` when given.

    Returns:
        token int64 `[B]` and its log-probability `[B]` (logits' dtype) under the policy
        before truncation (temperature, allowed tokens): top-k and top-p choose which token is
        drawn, not its recorded probability, so a trainer with the same weights computes the
        same log-prob (as TRL does). A row with nothing to sample (no allowed token, or
        NaN logits) gets `pad_token_id` and a NaN log-prob, never a silent token.
    """
    logits = logits.detach()
    if uniform is None:
        uniform = torch.rand(
            logits.shape, generator=generator, dtype=logits.dtype, device=logits.device
        )
    return _sample_tokens_op(
        logits,
        uniform,
        finished,
        allowed,
        _scalar(temperature, "temperature"),
        int(top_k),
        _scalar(top_p, "top_p"),
        int(eos_token_id),
        int(pad_token_id),
    )
