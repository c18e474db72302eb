"""ClippedAdam against clip_grad_norm_(foreach=True) followed by torch.optim.Adam(fused=True):
the same parameters, clipping or not, across checkpoints in either direction. The tolerance is
float32 rounding: ClippedAdam takes the global norm over its flat gradient at once, where
clip_grad_norm_ takes the norm of per-tensor norms, so the clip coefficient may differ in its
last bit."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nostall.optim import ClippedAdam


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _set_grads(net: torch.nn.Module, seed: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in net.parameters():
        p.grad = torch.randn(p.shape, generator=g) * scale


def _reference_step(net, optimizer, max_norm):
    torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm, foreach=True)
    optimizer.step()


def _assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-3, 0.1, 1.0, 30.0]),  # clipping off and on
    max_norm=st.floats(0.05, 5.0),
    steps=st.integers(1, 6),
    tensor_lr=st.booleans(),
)
def test_matches_clip_grad_norm_then_fused_adam(seed, scale, max_norm, steps, tensor_lr):
    ours, reference = _net(seed), _net(seed)
    lr = torch.tensor(3e-3) if tensor_lr else 3e-3
    opt = ClippedAdam(ours.parameters(), lr=lr, max_grad_norm=max_norm, eps=1e-5)
    ref = torch.optim.Adam(reference.parameters(), lr=copy.copy(lr), eps=1e-5, fused=True)
    for step in range(steps):
        _set_grads(ours, seed + step, scale)
        _set_grads(reference, seed + step, scale)
        opt.step()
        _reference_step(reference, ref, max_norm)
        _assert_same_parameters(ours, reference)
    for p in ours.parameters():
        assert int(opt.state[p]["step"]) == steps


def test_checkpoints_move_between_it_and_adam():
    ours, reference = _net(0), _net(0)
    ref = torch.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-5, fused=True)
    for step in range(3):
        _set_grads(reference, step, 1.0)
        _reference_step(reference, ref, 0.5)
    ours.load_state_dict(reference.state_dict())
    opt = ClippedAdam(ours.parameters(), lr=1e-2, max_grad_norm=0.5, eps=1e-5)
    opt.load_state_dict(copy.deepcopy(ref.state_dict()))  # loading keeps the same tensors
    for step in range(3, 6):
        _set_grads(ours, step, 1.0)
        _set_grads(reference, step, 1.0)
        opt.step()
        _reference_step(reference, ref, 0.5)
    _assert_same_parameters(ours, reference)
    back = torch.optim.Adam(_net(1).parameters(), lr=1e-2, eps=1e-5, fused=True)
    back.load_state_dict(copy.deepcopy(opt.state_dict()))  # and the other way
    assert int(back.state_dict()["state"][0]["step"]) == 6


def test_parameters_and_gradients_live_in_flat_buffers_and_still_train():
    net = _net(0)
    before = [p.detach().clone() for p in net.parameters()]
    opt = ClippedAdam(net.parameters(), lr=1e-2, max_grad_norm=1.0)
    for p, b in zip(net.parameters(), before, strict=True):
        assert torch.equal(p, b)  # flattening keeps the values
    x = torch.randn(5, 4)
    reference = _net(0)
    ref = torch.optim.Adam(reference.parameters(), lr=1e-2, fused=True)
    for step in range(3):
        opt.zero_grad()
        net(x).square().sum().backward()  # autograd accumulates into the flat gradient
        ref.zero_grad()
        reference(x).square().sum().backward()
        opt.step()
        _reference_step(reference, ref, 1.0)
        if step == 1:
            net.zero_grad(set_to_none=True)  # a module's zero_grad drops the views: rebound
    _assert_same_parameters(net, reference)
    assert all(p.grad is not None and p.grad.numel() == p.numel() for p in net.parameters())


def test_bad_use_is_refused():
    net = _net(0)
    with pytest.raises(ValueError, match="max_grad_norm must be positive"):
        ClippedAdam(net.parameters(), lr=1e-3, max_grad_norm=0.0)
    opt = ClippedAdam(net.parameters(), lr=1e-3, max_grad_norm=1.0)
    opt.step()  # zero gradients: a no-op update, no error
    with pytest.raises(ValueError, match="one parameter group"):
        ClippedAdam([{"params": [net[0].weight]}, {"params": [net[2].weight]}], 1e-3, 1.0)
    with pytest.raises(ValueError, match="one dtype and device"):
        ClippedAdam(
            [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2).double())],
            1e-3,
            1.0,
        )
    with pytest.raises(ValueError, match="a parameter twice"):
        ClippedAdam([net[0].weight, net[0].weight], 1e-3, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_norm", [1e-2, 1e3])
def test_a_step_on_an_outside_flat_gradient_is_the_same_step(dtype, max_norm):
    """gradients=False (master weights stepped from a bf16 copy's gradients): the step on a
    flat gradient of any dtype, widened a few elements at a time, is the step on that gradient
    widened whole, over three steps, clipping or not."""
    net, other = _net(0), _net(0)
    mine = ClippedAdam(net.parameters(), lr=1e-2, max_grad_norm=max_norm, gradients=False)
    theirs = ClippedAdam(other.parameters(), lr=1e-2, max_grad_norm=max_norm)
    assert mine.flat_gradient is None and all(p.grad is None for p in net.parameters())
    for step in range(3):
        grad = torch.randn(
            mine.flat_parameters.shape, generator=torch.Generator().manual_seed(step)
        ).to(dtype)
        mine.apply_flat_gradient(grad, chunk=7)
        theirs.flat_gradient.copy_(grad.float())
        theirs.apply_gradients()
        _assert_same_parameters(net, other)
    with pytest.raises(RuntimeError, match="apply_flat_gradient"):
        mine.apply_gradients()
    with pytest.raises(ValueError, match="grad must be the flat gradient"):
        mine.apply_flat_gradient(grad[:-1])


@pytest.mark.parametrize("tensor_lr", [False, True])  # the native step, then torch's ops
@pytest.mark.parametrize("scale", [1e-3, 30.0])  # clipping off and on
def test_a_measured_step_returns_the_gradient_norm_before_clipping(tensor_lr, scale):
    """apply_gradients(measure=True) returns the global 2-norm of the gradients as given
    (transformers' grad_norm: before clipping), and steps as an unmeasured step does; an
    unmeasured step returns None. The norm is compared with one taken here over the per-tensor
    gradients (float32 summation order: a few ulps)."""
    net, other = _net(0), _net(0)
    mine = ClippedAdam(net.parameters(), lr=_lr(tensor_lr), max_grad_norm=1.0)
    theirs = ClippedAdam(other.parameters(), lr=_lr(tensor_lr), max_grad_norm=1.0)
    group = mine.param_groups[0]
    assert mine._native_step_applies(group) is not tensor_lr  # both paths covered
    for step in range(3):
        _set_grads(net, step, scale)
        _set_grads(other, step, scale)
        want = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in net.parameters()]))
        norm = mine.apply_gradients(measure=True)
        assert theirs.apply_gradients() is None
        torch.testing.assert_close(norm, want, rtol=1e-6, atol=0)
        _assert_same_parameters(net, other)


def _lr(tensor: bool):
    return torch.tensor(1e-2) if tensor else 1e-2


def test_a_step_on_an_outside_flat_gradient_returns_its_norm():
    """apply_flat_gradient's norm, taken a chunk at a time in float32, is the whole bf16
    gradient's norm taken in float32."""
    net = _net(0)
    opt = ClippedAdam(net.parameters(), lr=1e-2, max_grad_norm=0.5, gradients=False)
    grad = torch.randn(opt.flat_parameters.shape, generator=torch.Generator().manual_seed(1))
    grad = grad.bfloat16()
    norm = opt.apply_flat_gradient(grad, chunk=7)
    want = torch.linalg.vector_norm(grad.double()).float()
    torch.testing.assert_close(norm, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_float32_norm_sums_in_float32_a_chunk_at_a_time(dtype):
    """float32_norm against the norm taken in float64, with chunks that do not divide the
    tensor: float32 sums of 10^5 squares agree to about 1e-6 relative, far inside 1e-5, where
    a bf16 sum would be off by about 1e-3."""
    from nostall.optim import float32_norm

    x = torch.randn(100_003, generator=torch.Generator().manual_seed(0)).to(dtype)
    got = float32_norm(x, chunk=4_096)
    assert got.dtype == torch.float32
    want = torch.linalg.vector_norm(x.double())
    assert abs(float(got) - float(want)) <= 1e-5 * float(want)
