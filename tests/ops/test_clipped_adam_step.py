"""`nostall::clipped_adam_step`, ClippedAdam's CPU step as one op: its agreement with torch's
clip_grad_norm_ + fused Adam is tests/test_optim.py's (ClippedAdam takes this op for a
number learning rate on the CPU, torch's ops for a tensor one; both are run there). Here:
opcheck, that the optimizer does take it, a non-finite gradient spread as clip_grad_norm_
spreads it, and every bad argument named."""

import pytest
import torch

import nostall.ops  # noqa: F401  (registers the fake kernels)
from nostall.optim import ClippedAdam


def _buffers(n=37, seed=0, scale=5.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) * s for s in (1.0, scale, 0.1, 0.0)] + [torch.tensor(0.0)]


def test_opcheck():
    param, grad, avg, sq, step = _buffers()
    sq.abs_()
    torch.library.opcheck(
        torch.ops.nostall.clipped_adam_step.default,
        (param, grad, avg, sq, step, 1e-3, 0.9, 0.999, 1e-8, 1.0),
    )


def test_steps_in_turn_against_the_formula():
    """Three calls, the clip binding on the first two (norm about 30 against 1) and not on the
    last, against the formula written out in float64."""
    param, grad, avg, sq, step = _buffers()
    p, m, v = param.double(), avg.double(), sq.double()
    lr, b1, b2, eps, max_norm = 1e-2, 0.9, 0.99, 1e-8, 1.0
    for t, scale in enumerate((5.0, 5.0, 1e-3), start=1):
        g = torch.randn(37, generator=torch.Generator().manual_seed(t)) * scale
        grad.copy_(g)
        torch.ops.nostall.clipped_adam_step(param, grad, avg, sq, step, lr, b1, b2, eps, max_norm)
        gd = g.double() * min(1.0, max_norm / (g.double().norm().item() + 1e-6))
        m = b1 * m + (1 - b1) * gd
        v = b2 * v + (1 - b2) * gd * gd
        p = p - lr / (1 - b1**t) * m / (v.sqrt() / (1 - b2**t) ** 0.5 + eps)
        assert step.item() == t
        torch.testing.assert_close(grad, gd.float(), rtol=1e-5, atol=1e-7)  # clipped in place
        torch.testing.assert_close(param, p.float(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(avg, m.float(), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(sq, v.float(), rtol=1e-5, atol=1e-9)


def test_clipped_adam_takes_the_op_for_a_number_learning_rate_on_the_cpu():
    params = [torch.nn.Parameter(torch.randn(3, 4))]
    assert ClippedAdam(params, lr=1e-3, max_grad_norm=1.0)._native_step_applies(
        {"lr": 1e-3, "weight_decay": 0.0, "amsgrad": False, "maximize": False}
    )
    opt = ClippedAdam(
        [torch.nn.Parameter(torch.randn(3))], lr=torch.tensor(1e-3), max_grad_norm=1.0
    )
    assert not opt._native_step_applies(opt.param_groups[0])


def test_a_non_finite_gradient_spreads_as_in_clip_grad_norm():
    param, grad, avg, sq, step = _buffers()
    grad[3] = float("nan")
    torch.ops.nostall.clipped_adam_step(param, grad, avg, sq, step, 1e-3, 0.9, 0.999, 1e-8, 1.0)
    assert torch.isnan(param).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(param=torch.zeros(37, dtype=torch.float64)), "param must be a contiguous CPU"),
        (dict(param=torch.zeros(37, 2)), "param must be"),
        (dict(grad=torch.zeros(36)), r"grad must be a contiguous CPU float32 \[37\]"),
        (dict(exp_avg=torch.zeros(74)[::2]), "exp_avg must be"),
        (dict(exp_avg_sq=torch.zeros(37, dtype=torch.float16)), "exp_avg_sq must be"),
        (dict(step=torch.zeros(1)), "step must be a CPU float32 scalar"),
        (dict(lr=-1.0), "lr must be non-negative"),
        (dict(beta1=1.0), r"beta1 must be in \[0, 1\)"),
        (dict(beta2=-0.1), r"beta2 must be in \[0, 1\)"),
        (dict(eps=-1e-8), "eps must be non-negative"),
        (dict(max_grad_norm=0.0), "max_grad_norm must be positive"),
    ],
)
def test_bad_arguments_are_named(change, message):
    param, grad, avg, sq, step = _buffers()
    args = dict(
        param=param,
        grad=grad,
        exp_avg=avg,
        exp_avg_sq=sq,
        step=step,
        lr=1e-3,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        max_grad_norm=1.0,
    )
    args.update(change)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.nostall.clipped_adam_step(**args)
    with pytest.raises(RuntimeError, match=message), torch._subclasses.FakeTensorMode() as mode:
        fake = {
            k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()
        }
        torch.ops.nostall.clipped_adam_step(**fake)


def test_the_bf16_step_against_the_formula_and_its_rounded_copy():
    """clipped_adam_step_bf16: the step over float32 master weights from a bf16 gradient (read,
    not clipped in place), the new parameters rounded into the bf16 copy, in three calls
    against the formula in float64 on the widened gradient; opcheck."""
    param, _, avg, sq, step = _buffers()
    rounded = torch.zeros(37, dtype=torch.bfloat16)
    p, m, v = param.double(), avg.double(), sq.double()
    lr, b1, b2, eps, max_norm = 1e-2, 0.9, 0.99, 1e-8, 1.0
    for t, scale in enumerate((5.0, 5.0, 1e-3), start=1):
        g = (torch.randn(37, generator=torch.Generator().manual_seed(t)) * scale).bfloat16()
        kept = g.clone()
        torch.ops.nostall.clipped_adam_step_bf16(
            param, g, avg, sq, step, rounded, lr, b1, b2, eps, max_norm
        )
        assert torch.equal(g, kept)  # (the gradient is read only)
        gd = g.double() * min(1.0, max_norm / (g.double().norm().item() + 1e-6))
        m = b1 * m + (1 - b1) * gd
        v = b2 * v + (1 - b2) * gd * gd
        p = p - lr / (1 - b1**t) * m / (v.sqrt() / (1 - b2**t) ** 0.5 + eps)
        assert step.item() == t
        torch.testing.assert_close(param, p.float(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(avg, m.float(), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(sq, v.float(), rtol=1e-5, atol=1e-9)
        assert torch.equal(rounded, param.bfloat16())  # torch's rounding, to the bit
    args = (param, g, avg, sq, step, rounded, lr, b1, b2, eps, max_norm)
    torch.library.opcheck(torch.ops.nostall.clipped_adam_step_bf16.default, args)
    with pytest.raises(RuntimeError, match=r"grad must be a contiguous CPU bfloat16 \[37\]"):
        torch.ops.nostall.clipped_adam_step_bf16(
            param, g.float(), avg, sq, step, rounded, lr, b1, b2, eps, max_norm
        )
    with pytest.raises(RuntimeError, match=r"rounded must be a contiguous CPU bfloat16 \[37\]"):
        torch.ops.nostall.clipped_adam_step_bf16(
            param, g, avg, sq, step, rounded[:-1], lr, b1, b2, eps, max_norm
        )


@pytest.mark.parametrize("tensor_lr", [False, True])
def test_step_rounding_is_the_outside_gradient_step_then_the_rounding(tensor_lr):
    """ClippedAdam.step_rounding (the native op) against apply_flat_gradient (torch's ops, a
    chunk at a time) then the copy rounded; a tensor learning rate keeps torch's path (False)."""
    g = torch.Generator().manual_seed(4)
    start = [torch.randn(40, 3, generator=g), torch.randn(7, generator=g)]
    runs = []
    for native in (True, False):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        lr = torch.tensor(3e-2) if tensor_lr else 3e-2
        opt = ClippedAdam(params, lr=lr, max_grad_norm=0.5, gradients=False)
        copy = torch.zeros(127, dtype=torch.bfloat16)
        for t in range(3):
            grad = (torch.randn(127, generator=torch.Generator().manual_seed(t)) * 2).bfloat16()
            if not (native and opt.step_rounding(grad, copy)):
                assert not native or tensor_lr  # (the op applies to a number learning rate)
                opt.apply_flat_gradient(grad)
                copy.copy_(opt.flat_parameters)
        runs.append((opt.flat_parameters.clone(), copy))
    (params, copy), (ref_params, ref_copy) = runs
    torch.testing.assert_close(params, ref_params, rtol=1e-5, atol=1e-6)
    assert (copy.float() - ref_copy.float()).abs().max() <= 2.0**-7 * ref_params.abs().max()
