"""Fake kernels of clipped_adam_step and clipped_adam_step_bf16 (mutating ops: they return
nothing), with the checks of csrc/ops/clipped_adam.cpp."""

import torch

from nostall import _native  # noqa: F401  (loads the native library first)
from nostall.ops._checks import _fail


@torch.library.register_fake("nostall::clipped_adam_step")
def _clipped_adam_step_fake(
    param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_grad_norm
):
    op = "clipped_adam_step"
    _check_step(op, param, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_grad_norm)
    _check_like(op, param, grad, "grad", torch.float32)


@torch.library.register_fake("nostall::clipped_adam_step_bf16")
def _clipped_adam_step_bf16_fake(
    param, grad, exp_avg, exp_avg_sq, step, rounded, lr, beta1, beta2, eps, max_grad_norm
):
    op = "clipped_adam_step_bf16"
    _check_step(op, param, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_grad_norm)
    _check_like(op, param, grad, "grad", torch.bfloat16)
    _check_like(op, param, rounded, "rounded", torch.bfloat16)


def _check_like(op, param, t, name, dtype):
    n = param.shape[0]
    if t.dtype != dtype or t.shape != (n,) or not t.is_contiguous():
        kind = "float32" if dtype == torch.float32 else "bfloat16"
        _fail(f"{op}: {name} must be a contiguous CPU {kind} [{n}], as param")


def _check_step(op, param, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_grad_norm):
    if param.dtype != torch.float32 or param.dim() != 1 or not param.is_contiguous():
        _fail(f"{op}: param must be a contiguous CPU float32 [n]")
    for t, name in ((exp_avg, "exp_avg"), (exp_avg_sq, "exp_avg_sq")):
        _check_like(op, param, t, name, torch.float32)
    if step.dtype != torch.float32 or step.dim() != 0:
        _fail(f"{op}: step must be a CPU float32 scalar tensor")
    if not lr >= 0:
        _fail(f"{op}: lr must be non-negative, got {lr}")
    if not 0 <= beta1 < 1:
        _fail(f"{op}: beta1 must be in [0, 1), got {beta1}")
    if not 0 <= beta2 < 1:
        _fail(f"{op}: beta2 must be in [0, 1), got {beta2}")
    if not eps >= 0:
        _fail(f"{op}: eps must be non-negative, got {eps}")
    if not max_grad_norm > 0:
        _fail(f"{op}: max_grad_norm must be positive, got {max_grad_norm}")
