"""TRL's clip_ratio figures (loss.clip_ratios) against a reference written here token by token
from TRL's definitions: a token is low-clipped when its ratio to the proximal policy is below
1 - clip_low and its completion's advantage is negative, high-clipped when above 1 + clip_high
and the advantage positive; the means are over the loss's tokens, the extremes over the
completions that have any. Shares of small integers: exact up to float32 division."""

import math

import pytest
import torch

from nostall.algos import grpo
from nostall.algos.grpo.loss import clip_ratios


def _reference(log_prob, old, advantage, mask, clip_low, clip_high):
    low = high = tokens = 0
    low_rows, high_rows = [], []
    for b in range(mask.shape[0]):
        row_low = row_high = row_tokens = 0
        for t in range(mask.shape[1]):
            if not mask[b, t]:
                continue
            ratio = math.exp(float(log_prob[b, t]) - float(old[b, t]))
            row_tokens += 1
            row_low += ratio < 1 - clip_low and float(advantage[b]) < 0
            row_high += ratio > 1 + clip_high and float(advantage[b]) > 0
        low, high, tokens = low + row_low, high + row_high, tokens + row_tokens
        if row_tokens:
            low_rows.append(row_low / row_tokens)
            high_rows.append(row_high / row_tokens)
    tokens = max(tokens, 1)
    return [
        low / tokens,
        min(low_rows, default=math.nan),
        high / tokens,
        max(high_rows, default=math.nan),
        (low + high) / tokens,  # (a token is clipped on one side at most)
    ]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("clip_low", "clip_high"), [(0.2, None), (0.2, 0.28)])
def test_clip_ratios_match_the_definitions(seed, clip_low, clip_high):
    g = torch.Generator().manual_seed(seed)
    B, C = 6, 7
    old = torch.randn(B, C, generator=g)
    log_prob = old + 0.4 * torch.randn(B, C, generator=g)  # ratios on both sides of the clip
    advantage = torch.randn(B, generator=g)
    mask = torch.rand(B, C, generator=g) < 0.7
    mask[seed % B] = False  # a completion with no tokens: out of the extremes
    args = grpo.GRPOCommandConfig(clip_low=clip_low, clip_high=clip_high)
    got = clip_ratios(log_prob, old, advantage, mask, args)
    want = _reference(log_prob, old, advantage, mask, clip_low, clip_high or clip_low)
    assert any(w > 0 for w in want), want  # the draw clips something
    for name, g_, w in zip(grpo.CLIP_RATIOS, got, want, strict=True):
        assert g_.shape == () and g_.dtype == torch.float32
        assert float(g_) == pytest.approx(w, rel=1e-6, abs=0), name


def test_no_tokens_give_no_extremes_and_no_division_by_zero():
    """A micro-batch whose every completion was masked (truncated, with
    mask_truncated_completions): shares of zero, extremes NaN (TRL's nanmin / nanmax of
    nothing)."""
    args = grpo.GRPOCommandConfig()
    zeros = torch.zeros(2, 3)
    got = clip_ratios(zeros, zeros + 1, torch.ones(2), torch.zeros(2, 3, dtype=torch.bool), args)
    shares, extremes = [got[0], got[2], got[4]], [got[1], got[3]]
    assert all(float(v) == 0.0 for v in shares)
    assert all(math.isnan(float(v)) for v in extremes)
