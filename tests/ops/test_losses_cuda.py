"""CUDA-only behaviour of the loss ops: agreement with the CPU kernels, no host sync, the
caller's current stream, and NaN (not a sync to raise) for out-of-range indices."""

import pytest
import torch

import nostall
from tests.ops.losses_data import grouped_rewards, logits_batch, token_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present"),
]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_cpu(scale):
    reward, index = grouped_rewards([1, 7, 3, 16, 2] * 20, seed=1)
    cpu = reward.clone().requires_grad_()
    gpu = reward.cuda().requires_grad_()
    w = torch.randn_like(reward)
    a = nostall.group_advantages(cpu, index, 100, scale)
    b = nostall.group_advantages(gpu, index.cuda(), 100, scale)
    torch.testing.assert_close(b.cpu(), a, rtol=1e-12, atol=1e-12)
    (a * w).sum().backward()
    (b * w.cuda()).sum().backward()
    torch.testing.assert_close(gpu.grad.cpu(), cpu.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("V", [1, 31, 32000])
def test_token_log_prob_matches_cpu(dtype, V):
    logits, tokens = logits_batch(3, 17, V, dtype, seed=2)
    cpu, gpu = logits.clone().requires_grad_(), logits.cuda().requires_grad_()
    a = nostall.token_log_prob(cpu, tokens)
    b = nostall.token_log_prob(gpu, tokens.cuda())
    torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=2e-5)
    g = torch.randn_like(a)
    a.backward(g)
    b.backward(g.cuda())
    tol = dict(rtol=2e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu.grad.cpu(), cpu.grad, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_log_prob_linear_matches_cpu(dtype):
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 64, 32, generator=g).to(dtype)
    weight = (torch.randn(1000, 32, generator=g) * 0.2).to(dtype)
    tokens = torch.randint(0, 1000, (4, 64), generator=g)
    outs = []
    for device in ("cpu", "cuda"):
        h = hidden.to(device).requires_grad_()
        w = weight.to(device).requires_grad_()
        lp = nostall.token_log_prob_linear(h, w, tokens.to(device), chunk_size=50)
        lp.sum().backward()
        outs.append([lp.cpu().float(), h.grad.cpu().float(), w.grad.cpu().float()])
    tol = dict(rtol=5e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(b, a, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("V", [1, 31, 1000])
def test_token_entropy_linear_matches_cpu(dtype, V):
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(4, 64, 32, generator=g).to(dtype)
    weight = (torch.randn(V, 32, generator=g) * 0.2).to(dtype)
    weights = torch.randn(4, 64, generator=g)
    outs = []
    for device in ("cpu", "cuda"):
        h = hidden.to(device).requires_grad_()
        w = weight.to(device).requires_grad_()
        entropy = nostall.token_entropy_linear(h, w, chunk_size=50)
        (entropy * weights.to(device, entropy.dtype)).sum().backward()
        outs.append([entropy.cpu().float(), h.grad.cpu().float(), w.grad.cpu().float()])
    tol = dict(rtol=5e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(b, a, **tol)


@pytest.mark.parametrize(
    "aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
)
def test_policy_loss_matches_cpu(aggregation):
    lp, old, beh, adv, mask = token_batch(32, 300, seed=4)
    kwargs = dict(dual_clip=3.0, behavior_log_prob=beh)
    cpu = lp.clone().requires_grad_()
    a = nostall.clipped_policy_loss(cpu, old, adv, mask, 0.2, 0.28, aggregation, 512, **kwargs)
    gpu = lp.cuda().requires_grad_()
    kwargs["behavior_log_prob"] = beh.cuda()
    b = nostall.clipped_policy_loss(
        gpu, old.cuda(), adv.cuda(), mask.cuda(), 0.2, 0.28, aggregation, 512, **kwargs
    )
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(y.cpu(), x, rtol=1e-12, atol=1e-12)
    a.loss.backward()
    b.loss.backward()
    torch.testing.assert_close(gpu.grad.cpu(), cpu.grad, rtol=1e-12, atol=1e-14)


def test_policy_loss_is_deterministic():
    lp, old, _, adv, mask = (t.cuda() for t in token_batch(64, 500, dtype=torch.float32, seed=5))
    first = nostall.clipped_policy_loss(lp, old, adv, mask)
    for _ in range(3):
        again = nostall.clipped_policy_loss(lp, old, adv, mask)
        assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))


def test_no_host_sync_forward_or_backward():
    reward, index = grouped_rewards([8] * 64, dtype=torch.float32, seed=6)
    reward, index = reward.cuda(), index.cuda()
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(64, 32, 64, generator=g).cuda().requires_grad_()
    weight = torch.randn(5000, 64, generator=g).cuda().requires_grad_()
    tokens = torch.randint(0, 5000, (64, 32), generator=g).cuda()
    mask = torch.rand(64, 32, generator=g).cuda() < 0.9
    old = torch.randn(64, 32, device="cuda") - 5
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        adv = nostall.group_advantages(reward, index, 64)
        lp = nostall.token_log_prob_linear(hidden, weight, tokens, chunk_size=256)
        out = nostall.clipped_policy_loss(lp, old, adv, mask, 0.2, 0.28, "seq_mean_token_sum_norm")
        out.loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_runs_on_the_current_stream():
    logits, tokens = logits_batch(8, 128, 4096, seed=8)
    logits, tokens = logits.cuda(), tokens.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        lp = nostall.token_log_prob(logits, tokens)
    # Recorded on the side stream: waiting on it alone is enough to read the result.
    side.synchronize()
    torch.testing.assert_close(lp, nostall.token_log_prob(logits.cpu(), tokens.cpu()).cuda())


def test_out_of_range_indices_give_nan_instead_of_a_sync():
    logits, tokens = logits_batch(2, 3, 10, seed=9)
    tokens[1, 1] = 10
    lp = nostall.token_log_prob(logits.cuda(), tokens.cuda()).cpu()
    assert lp[1, 1].isnan() and not lp[0].isnan().any()
    reward, index = grouped_rewards([2, 3], seed=10)
    index[0] = 7
    adv = nostall.group_advantages(reward.cuda(), index.cuda(), 2).cpu()
    assert adv[0].isnan() and not adv[1:].isnan().any()
