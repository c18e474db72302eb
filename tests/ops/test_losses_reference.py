"""The loss ops against their pure-PyTorch references (nostall.ops.reference) and against TRL's
published GRPO formulas, values and gradients.

Tolerances: float64 agrees to 1e-12 (different summation order only); float32 to 2e-6 in
log-probabilities (a few ulp of a sum over V) and 1e-6 relative in losses; bfloat16 logits are
judged as the issue states, against how far a bfloat16 computation lands from float32.
"""

import pytest
import torch

import nostall
from nostall.ops import reference
from tests.ops.losses_data import grouped_rewards, logits_batch, token_batch

F64 = dict(rtol=1e-12, atol=1e-12)
AGGREGATIONS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


# group_advantages -------------------------------------------------------------------------


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("sizes", [[4, 4, 4], [1, 3, 8, 2], [5], [1, 1, 1]])
def test_group_advantages_match_reference(scale, sizes):
    reward, index = grouped_rewards(sizes, seed=len(sizes))
    got = nostall.group_advantages(reward, index, len(sizes), scale)
    torch.testing.assert_close(got, reference.group_advantages(reward, index, len(sizes), scale))


def test_group_of_one_gets_zero_advantage_and_no_nan():
    reward, index = grouped_rewards([1, 3, 1], seed=3)
    for scale in ("group", "batch", "none"):
        for eps in (1e-4, 0.0):
            adv = nostall.group_advantages(reward, index, 3, scale, eps)
            assert not adv.isnan().any()
            singles = (index == 0) | (index == 2)
            assert (adv[singles] == 0).all()


def test_a_group_with_no_member_is_allowed():
    reward, index = grouped_rewards([3, 2], seed=4)
    adv = nostall.group_advantages(reward, index, 5)  # groups 2..4 empty
    torch.testing.assert_close(adv, reference.group_advantages(reward, index, 5))


def test_float32_rewards_accumulate_in_float64():
    reward, index = grouped_rewards([64] * 8, dtype=torch.float32, seed=5)
    reward = reward + 1e4  # a large offset: float32 sums would lose the deviations
    got = nostall.group_advantages(reward, index, 8)
    want = reference.group_advantages(reward.double(), index, 8).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_gradcheck(scale):
    reward, index = grouped_rewards([3, 1, 4, 2], seed=6)
    reward.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda r: nostall.group_advantages(r, index, 4, scale), reward)


def test_group_advantages_gradient_matches_reference_autograd():
    reward, index = grouped_rewards([5, 2, 7], seed=7)
    w = torch.randn(len(reward), dtype=torch.float64)
    ours, theirs = reward.clone().requires_grad_(), reward.clone().requires_grad_()
    for scale in ("group", "batch", "none"):
        ours.grad = theirs.grad = None
        (nostall.group_advantages(ours, index, 3, scale) * w).sum().backward()
        (reference.group_advantages(theirs, index, 3, scale) * w).sum().backward()
        torch.testing.assert_close(ours.grad, theirs.grad, **F64)


def trl_advantages(rewards, num_generations, scale_rewards):
    """TRL's GRPOTrainer advantages (trl/trainer/grpo_trainer.py, `_generate_and_score_
    completions`), written out from its published definition: equal groups of consecutive
    completions, std by torch.std (unbiased), 1e-4 added."""
    mean_grouped = rewards.view(-1, num_generations).mean(dim=1)
    mean_grouped = mean_grouped.repeat_interleave(num_generations, dim=0)
    if scale_rewards == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        std = rewards.view(-1, num_generations).std(dim=1)
        std = std.repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return advantages


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_trl(scale):
    G, groups = 8, 16
    rewards = torch.rand(G * groups, dtype=torch.float64).round()  # 0/1 rewards, some ties
    index = torch.arange(groups).repeat_interleave(G)
    got = nostall.group_advantages(rewards, index, groups, scale)
    torch.testing.assert_close(got, trl_advantages(rewards, G, scale), **F64)


# token_log_prob ---------------------------------------------------------------------------


@pytest.mark.parametrize("V", [1, 7, 33, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_token_log_prob_matches_reference(V, dtype):
    logits, tokens = logits_batch(3, 5, V, dtype, seed=V)
    got = nostall.token_log_prob(logits, tokens)
    want = reference.token_log_prob(logits, tokens)
    assert got.dtype == want.dtype
    tol = F64 if dtype == torch.float64 else dict(rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(got, want, **tol)


def test_token_log_prob_gradient_matches_reference():
    logits, tokens = logits_batch(4, 6, 257, torch.float32, seed=1)
    w = torch.randn(4, 6)
    ours, theirs = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    (nostall.token_log_prob(ours, tokens) * w).sum().backward()
    (reference.token_log_prob(theirs, tokens) * w).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6)


def test_token_log_prob_gradcheck():
    logits, tokens = logits_batch(2, 3, 11, torch.float64, seed=2)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: nostall.token_log_prob(x, tokens), logits)


def _max_error(x, ref):
    return (x.double() - ref.double()).abs().max().item()


def test_bfloat16_no_worse_than_twice_a_bfloat16_reference():
    # The criterion: nostall on bf16 logits is at most 2x as far from the float32 result as
    # a computation carried out in bf16 itself (log_softmax in bf16, gather).
    logits, tokens = logits_batch(4, 64, 32000, torch.bfloat16, seed=3)
    exact = reference.token_log_prob(logits.float(), tokens)
    bf16_reference = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    ours = nostall.token_log_prob(logits, tokens)
    assert ours.dtype == torch.float32
    assert _max_error(ours, exact) <= 2 * _max_error(bf16_reference, exact)
    # ... and in fact close to float32 accuracy, thanks to the float32 accumulation.
    assert _max_error(ours, exact) < 1e-4

    # Gradients: compare to the float32 gradient, against a bf16 backward's distance.
    g = torch.randn(4, 64)
    x32 = logits.float().requires_grad_()
    (reference.token_log_prob(x32, tokens) * g).sum().backward()
    xb = logits.clone().requires_grad_()
    (torch.log_softmax(xb, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1) * g).sum().backward()
    xo = logits.clone().requires_grad_()
    (nostall.token_log_prob(xo, tokens) * g).sum().backward()
    assert xo.grad.dtype == torch.bfloat16
    assert _max_error(xo.grad, x32.grad) <= 2 * _max_error(xb.grad, x32.grad)


def test_masked_vocabulary_entries_get_exactly_zero_gradient():
    logits, tokens = logits_batch(2, 3, 40, torch.float32, seed=4)
    logits[..., 30:] = float("-inf")  # e.g. padded vocabulary rows
    tokens = tokens % 30
    x = logits.clone().requires_grad_()
    lp = nostall.token_log_prob(x, tokens)
    torch.testing.assert_close(lp, reference.token_log_prob(logits, tokens))
    lp.sum().backward()
    assert (x.grad[..., 30:] == 0).all()


def test_nan_logits_give_nan_for_that_row_only():
    logits, tokens = logits_batch(2, 2, 20, torch.float32, seed=5)
    logits[1, 0, 7] = float("nan")
    lp = nostall.token_log_prob(logits, tokens)
    assert lp[1, 0].isnan()
    assert not lp[0].isnan().any() and not lp[1, 1].isnan()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [1, 5, 7, 1000])
def test_linear_variant_matches_reference(dtype, chunk_size):
    g = torch.Generator().manual_seed(chunk_size)
    B, T, H, V = 3, 5, 16, 50
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype)
    tokens = torch.randint(0, V, (B, T), generator=g)
    w = torch.randn(B, T, generator=g, dtype=torch.float64)
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ours = nostall.token_log_prob_linear(h1, w1, tokens, chunk_size)
    want = reference.token_log_prob_linear(h2, w2, tokens)
    (ours * w.to(ours.dtype)).sum().backward()
    (want * w.to(want.dtype)).sum().backward()
    if dtype == torch.bfloat16:
        # The logits themselves are bf16 products in both; compare against float32 math.
        exact = reference.token_log_prob_linear(hidden.float(), weight.float(), tokens)
        assert _max_error(ours, exact) <= 2 * _max_error(want, exact) + 1e-6
        return
    tol = F64 if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, want, **tol)
    torch.testing.assert_close(h1.grad, h2.grad, **tol)
    torch.testing.assert_close(w1.grad, w2.grad, **tol)


def test_linear_variant_gradcheck():
    g = torch.Generator().manual_seed(9)
    hidden = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 9, (2, 3), generator=g)
    assert torch.autograd.gradcheck(
        lambda h, w: nostall.token_log_prob_linear(h, w, tokens, 4), (hidden, weight)
    )


def test_linear_variant_bf16_accumulates_the_weight_gradient_in_float32():
    # Many chunks each add a small bf16 product: float32 accumulation keeps them.
    g = torch.Generator().manual_seed(10)
    hidden = torch.randn(8, 64, 32, generator=g).to(torch.bfloat16)
    weight = (torch.randn(100, 32, generator=g) * 0.1).to(torch.bfloat16)
    tokens = torch.randint(0, 100, (8, 64), generator=g)
    w = weight.clone().requires_grad_()
    nostall.token_log_prob_linear(hidden, w, tokens, chunk_size=4).sum().backward()
    w32 = weight.float().requires_grad_()
    reference.token_log_prob_linear(hidden.float(), w32, tokens).sum().backward()
    wb = weight.clone().requires_grad_()
    reference.token_log_prob_linear(hidden, wb, tokens).sum().backward()
    assert _max_error(w.grad, w32.grad) <= 2 * _max_error(wb.grad, w32.grad)


# clipped_policy_loss ----------------------------------------------------------------------


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("behavior", [False, True])
@pytest.mark.parametrize("per_token_advantage", [False, True])
def test_policy_loss_matches_reference(aggregation, dual_clip, behavior, per_token_advantage):
    lp, old, beh, adv, mask = token_batch(6, 9, seed=11, per_token_advantage=per_token_advantage)
    beh = beh if behavior else None
    got = nostall.clipped_policy_loss(
        lp, old, adv, mask, 0.2, 0.28, aggregation, 12, dual_clip=dual_clip, behavior_log_prob=beh
    )
    want = reference.clipped_policy_loss(
        lp, old, adv, mask, 0.2, 0.28, aggregation, 12, dual_clip, beh, 2.0
    )
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **F64)
    assert 0 < got.clip_fraction < 1  # the data exercises both branches

    x, y = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    nostall.clipped_policy_loss(
        x, old, adv, mask, 0.2, 0.28, aggregation, 12, dual_clip=dual_clip, behavior_log_prob=beh
    ).loss.backward()
    reference.clipped_policy_loss(
        y, old, adv, mask, 0.2, 0.28, aggregation, 12, dual_clip, beh, 2.0
    )[0].backward()
    torch.testing.assert_close(x.grad, y.grad, **F64)


def test_policy_loss_float32_matches_reference():
    lp, old, _beh, adv, mask = token_batch(16, 128, dtype=torch.float32, seed=12)
    got = nostall.clipped_policy_loss(lp, old, adv, mask, 0.2, 0.2, "seq_mean_token_mean", 128)
    want = reference.clipped_policy_loss(lp, old, adv, mask, 0.2, 0.2, "seq_mean_token_mean", 128)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_policy_loss_gradcheck(aggregation):
    lp, old, beh, adv, mask = token_batch(4, 6, seed=13)
    lp.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: (
            nostall.clipped_policy_loss(
                x, old, adv, mask, 0.2, 0.3, aggregation, 8, dual_clip=2.0, behavior_log_prob=beh
            ).loss
        ),
        lp,
    )


def test_masked_tokens_may_hold_nan():
    lp, old, _beh, adv, mask = token_batch(3, 7, seed=14)
    mask[0, -1] = False
    dirty = lp.clone()
    dirty[0, -1] = float("nan")
    clean = nostall.clipped_policy_loss(lp, old, adv, mask)
    x = dirty.clone().requires_grad_()
    out = nostall.clipped_policy_loss(x, old, adv, mask)
    torch.testing.assert_close(out, clean)
    out.loss.backward()
    assert x.grad[0, -1] == 0 and not x.grad.isnan().any()


def test_unmasked_nan_reaches_the_loss():
    lp, old, _beh, adv, mask = token_batch(3, 7, seed=15)
    lp[1, 0] = float("nan")
    assert nostall.clipped_policy_loss(lp, old, adv, mask).loss.isnan()


def test_fully_masked_batch_gives_zero_not_nan():
    lp, old, _beh, adv, mask = token_batch(2, 3, seed=16)
    for aggregation in AGGREGATIONS:
        out = nostall.clipped_policy_loss(
            lp, old, adv, torch.zeros_like(mask), 0.2, 0.2, aggregation
        )
        assert out.loss == 0 and out.clip_fraction == 0 and out.approx_kl == 0


def trl_grpo_loss(
    per_token_logps,
    old_per_token_logps,
    advantages,
    completion_mask,
    loss_type,
    epsilon_low,
    epsilon_high,
    max_completion_length,
):
    """TRL's GRPOTrainer._compute_loss (trl/trainer/grpo_trainer.py), beta = 0, written out
    from its published definition: the mask is float, the advantages are per sequence."""
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages.unsqueeze(1)
    per_token_loss2 = coef_2 * advantages.unsqueeze(1)
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    if loss_type == "grpo":
        loss = (per_token_loss * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)
        return loss.mean()
    if loss_type == "bnpo":
        return (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        denom = per_token_loss.size(0) * max_completion_length
        return (per_token_loss * completion_mask).sum() / denom
    raise ValueError(loss_type)


@pytest.mark.parametrize(
    "loss_type,aggregation",
    [
        ("grpo", "seq_mean_token_mean"),
        ("bnpo", "token_mean"),
        ("dr_grpo", "seq_mean_token_sum_norm"),
    ],
)
def test_policy_loss_matches_trl(loss_type, aggregation):
    lp, old, _beh, adv, mask = token_batch(8, 20, seed=17)
    max_len = 32
    ours_x, trl_x = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    ours = nostall.clipped_policy_loss(ours_x, old, adv, mask, 0.2, 0.28, aggregation, max_len)
    theirs = trl_grpo_loss(trl_x, old, adv, mask.double(), loss_type, 0.2, 0.28, max_len)
    torch.testing.assert_close(ours.loss, theirs, **F64)
    ours.loss.backward()
    theirs.backward()
    torch.testing.assert_close(ours_x.grad, trl_x.grad, **F64)


def test_trl_clip_ratio_matches_clip_fraction():
    # TRL logs is_region_clipped = (coef_1 < 1 - eps_low & A < 0) | (coef_1 > 1 + eps_high & A > 0)
    # as a masked mean: the same quantity as clip_fraction without a dual clip.
    lp, old, _beh, adv, mask = token_batch(8, 20, seed=18)
    coef = (lp - old).exp()
    a = adv.unsqueeze(1)
    region = ((coef < 0.8) & (a < 0)) | ((coef > 1.28) & (a > 0))
    want = (region.double() * mask).sum() / mask.sum()
    got = nostall.clipped_policy_loss(lp, old, adv, mask, 0.2, 0.28).clip_fraction
    torch.testing.assert_close(got, want, **F64)
