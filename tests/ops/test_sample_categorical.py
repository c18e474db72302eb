"""sample_categorical: the Gumbel-max action and its log-probability against plain PyTorch,
the sampled frequencies against softmax, the log-probability's gradient, opcheck, compile,
errors, and CUDA agreement without a sync."""

import pytest
import torch

import nostall
from nostall.ops.networks import sample_categorical

ops = torch.ops.nostall


def reference(logits, uniform):
    action = (logits - uniform.clamp(min=1e-20).log().neg().log()).argmax(-1)
    return action, logits.log_softmax(-1).gather(-1, action[:, None]).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(8, 2), (1, 1), (300, 7), (4, 5000), (0, 3)])
def test_matches_reference(dtype, shape):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(shape, generator=g, dtype=dtype) * 3
    uniform = torch.rand(shape, generator=g, dtype=dtype)
    action, log_prob = sample_categorical(logits, uniform=uniform)
    ref_action, ref_log_prob = reference(logits, uniform)
    assert torch.equal(action, ref_action)
    tol = dict(rtol=1e-6, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(log_prob, ref_log_prob, **tol)


def test_generator_decides_the_samples():
    logits = torch.randn(64, 4)
    a1, _ = sample_categorical(logits, torch.Generator().manual_seed(5))
    a2, _ = sample_categorical(logits, torch.Generator().manual_seed(5))
    a3, _ = sample_categorical(logits, torch.Generator().manual_seed(6))
    assert torch.equal(a1, a2) and not torch.equal(a1, a3)


def test_frequencies_follow_softmax():
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0]]).expand(40_000, 4).contiguous()
    action, _ = sample_categorical(logits, torch.Generator().manual_seed(1))
    freq = torch.bincount(action, minlength=4).double() / action.numel()
    # 40k draws: each frequency's standard error is below 0.0025; 4 of them allow 0.01.
    torch.testing.assert_close(freq, logits[0].double().softmax(-1), rtol=0, atol=0.01)


def test_ties_and_extreme_noise():
    logits = torch.zeros(3, 4)
    uniform = torch.tensor([[0.5] * 4, [0.0] * 4, [1.0 - 2**-24] * 4])
    action, log_prob = sample_categorical(logits, uniform=uniform)
    assert action.tolist() == [0, 0, 0]  # ties keep the lowest index, as argmax
    torch.testing.assert_close(log_prob, torch.full((3,), -torch.log(torch.tensor(4.0)).item()))


def test_log_prob_gradient_and_gradcheck():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    uniform = torch.rand(6, 5, generator=g, dtype=torch.float64)
    _, log_prob = sample_categorical(logits, uniform=uniform)
    w = torch.randn(6, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((log_prob * w).sum(), logits)
    ref = logits.detach().clone().requires_grad_(True)
    (ref_grad,) = torch.autograd.grad((reference(ref, uniform)[1] * w).sum(), ref)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: sample_categorical(x, uniform=uniform)[1], (logits,))


def test_opcheck_and_compile():
    logits = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    uniform = torch.rand(5, 3, dtype=torch.float64)
    torch.library.opcheck(ops.sample_categorical.default, (logits, uniform))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, u: sample_categorical(x, uniform=u), fullgraph=True)
    a, lp = compiled(logits, uniform)
    b, lq = sample_categorical(logits, uniform=uniform)
    assert torch.equal(a, b)
    torch.testing.assert_close(lp, lq)


def test_noise_requiring_grad_is_refused():
    logits = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="uniform must not require grad"):
        sample_categorical(logits, uniform=torch.rand(2, 3, requires_grad=True))


@pytest.mark.parametrize(
    "logits, uniform, message",
    [
        (torch.zeros(3), torch.zeros(3), "logits must be \\[N, A\\]"),
        (torch.zeros(3, 2).long(), torch.zeros(3, 2), "logits must be float32 or float64"),
        (torch.zeros(3, 0), torch.zeros(3, 0), "at least one action"),
        (torch.zeros(3, 2), torch.zeros(3, 3), "uniform must have the shape of logits \\[3, 2\\]"),
        (torch.zeros(3, 2), torch.zeros(3, 2).double(), "uniform must have the dtype of logits"),
    ],
)
def test_bad_arguments(logits, uniform, message):
    with pytest.raises(RuntimeError, match=message):
        ops.sample_categorical(logits, uniform)
    with pytest.raises(RuntimeError, match=message), torch._subclasses.FakeTensorMode() as mode:
        ops.sample_categorical(mode.from_tensor(logits), mode.from_tensor(uniform))


def test_public_name():
    assert nostall.sample_categorical is sample_categorical


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
def test_cuda_matches_cpu_without_sync():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(1000, 6, generator=g)
    uniform = torch.rand(1000, 6, generator=g)
    gl, gu = logits.cuda(), uniform.cuda()
    torch.cuda.set_sync_debug_mode("error")
    try:
        action, log_prob = sample_categorical(gl, uniform=gu)
        sample_categorical(gl, torch.Generator("cuda").manual_seed(0))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ref_action, ref_log_prob = sample_categorical(logits, uniform=uniform)
    assert torch.equal(action.cpu(), ref_action)
    torch.testing.assert_close(log_prob.cpu(), ref_log_prob, rtol=1e-5, atol=1e-5)


def test_nan_or_all_masked_logits_are_visible_in_the_log_prob():
    """No valid action exists: the action is 0 by convention, and the log-probability is NaN,
    never a finite number a trainer would silently learn from."""
    logits = torch.tensor([[float("nan")] * 3, [float("-inf")] * 3, [1.0, 2.0, 3.0]])
    action, log_prob = sample_categorical(logits, torch.Generator().manual_seed(0))
    assert torch.isnan(log_prob[:2]).all() and torch.isfinite(log_prob[2])
    assert (action[:2] == 0).all()
