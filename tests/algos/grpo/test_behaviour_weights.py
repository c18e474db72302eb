"""The behaviour weight (loss.behaviour_weights) against TRL 1.16's vLLM importance-sampling
ratio written out (GRPOTrainer._generate_and_score_completions), in each of its four modes,
and the loss it weighs (grpo_loss through clipped_policy_loss) against the decoupled
objective written out with that weight. Float32 arithmetic on the same inputs: the weights
agree to rounding (1e-6 relative); the loss to the op's summation order (1e-5)."""

import math

import pytest
import torch

from nostall.algos import grpo
from nostall.algos.grpo.config_checks import BEHAVIOUR_MODES
from nostall.algos.grpo.loss import behaviour_weights


def trl_ratio(old, sampling, mask, mode, clip_min, clip_max):
    """TRL's vllm_importance_sampling_ratio, as its trainer computes it."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def _inputs(seed, B=8, C=6):
    g = torch.Generator().manual_seed(seed)
    log_prob = (torch.randn(B, C, generator=g) * 0.3 - 1.0).requires_grad_()
    old = log_prob.detach() + 0.1 * torch.randn(B, C, generator=g)
    behaviour = old + 0.4 * torch.randn(B, C, generator=g)  # ratios on both sides of the bounds
    advantage = torch.randn(B, generator=g)
    mask = torch.rand(B, C, generator=g) < 0.8
    mask[:, 0] = True
    return log_prob, old, behaviour, advantage, mask


@pytest.mark.parametrize("mode", BEHAVIOUR_MODES)
@pytest.mark.parametrize(("clip_min", "clip_max"), [(None, 3.0), (0.5, 1.5), (0.8, None)])
def test_the_weight_is_trls_ratio(mode, clip_min, clip_max):
    _, old, behaviour, _, mask = _inputs(seed=1)
    args = grpo.GRPOConfig(
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=clip_min,
        is_cap=clip_max,
    )
    got = behaviour_weights(old, behaviour, mask, args)
    want = trl_ratio(old, behaviour, mask, mode, clip_min, clip_max).expand_as(old)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    if mode.endswith("mask") and (clip_min, clip_max) == (0.5, 1.5):
        assert (got == 0).any()  # the draw puts some past a bound: masking is exercised


@pytest.mark.parametrize("mode", BEHAVIOUR_MODES)
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_the_loss_is_the_surrogate_times_the_weight(mode, loss_type):
    """TRL: per_token_loss * importance_sampling_ratio, aggregated as the loss type; the
    weight a constant. Gradients too (a masked token's and completion's is zero)."""
    log_prob, old, behaviour, advantage, mask = _inputs(seed=2)
    args = grpo.GRPOConfig(loss_type=loss_type, vllm_importance_sampling_mode=mode, is_cap=1.5)
    loss = grpo.grpo_loss(log_prob, old, advantage, mask, args, behavior_log_prob=behaviour)[0]
    weight = trl_ratio(old, behaviour, mask, mode, None, 1.5)
    ratio = torch.exp(log_prob - old)
    clipped = torch.clamp(ratio, 0.8, 1.2)
    per_token = -torch.min(ratio * advantage[:, None], clipped * advantage[:, None]) * weight
    m = mask.float()
    if loss_type == "grpo":
        expected = ((per_token * m).sum(-1) / m.sum(-1)).mean()
    else:
        expected = (per_token * m).sum() / m.sum()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    grad = torch.autograd.grad(loss, log_prob)[0]
    want = torch.autograd.grad(expected, log_prob)[0]
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6)


def test_bad_modes_and_bounds_are_refused_by_name():
    with pytest.raises(ValueError, match="--vllm-importance-sampling-mode must be one of"):
        grpo.GRPOConfig(vllm_importance_sampling_mode="token").check()
    with pytest.raises(ValueError, match=r"--vllm-importance-sampling-clip-min 2\.0 must be at"):
        grpo.GRPOConfig(vllm_importance_sampling_clip_min=2.0, is_cap=1.5).check()
    with pytest.raises(ValueError, match="--vllm-importance-sampling-clip-min must be a finite"):
        grpo.GRPOConfig(vllm_importance_sampling_clip_min=-1.0).check()
    config = grpo.GRPOConfig(vllm_importance_sampling_clip_max=2.5)  # TRL's name for is_cap
    assert config.is_cap == 2.5
    config = grpo.GRPOConfig(vllm_importance_sampling_cap=2.5)  # (TRL's deprecated name)
    assert config.is_cap == 2.5
