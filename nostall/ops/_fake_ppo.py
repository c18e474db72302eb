"""Fake (meta) kernels of the PPO loss ops, with the argument checks of csrc/ops/ppo_loss.h
(same messages, RuntimeError)."""

import math

import torch

from nostall.ops._checks import FLOAT_DTYPES
from nostall.ops._fake_losses import _check

Tensor = torch.Tensor


# ppo_loss -----------------------------------------------------------------------------------


def _check_ppo_sample_values(t, name, ref, ref_name):
    m = ref.shape[0]
    where = "row of " if ref.dim() == 2 else "sample of "
    _check(
        t.dim() == 1 and t.shape[0] == m, f"{name} must be [M] = [{m}], one per {where}{ref_name}"
    )
    _check(
        t.dtype == ref.dtype,
        f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}",
    )
    _check(t.device == ref.device, f"{name} must be on the device of {ref_name}")


def _check_ppo_targets_and_scalars(
    ref,
    ref_name,
    value,
    old_log_prob,
    old_value,
    advantage,
    value_target,
    clip_coef,
    value_clip,
    ent_coef,
    vf_coef,
    normalize_advantage,
):
    for t, name in (
        (value, "value"),
        (old_log_prob, "old_log_prob"),
        (old_value, "old_value"),
        (advantage, "advantage"),
        (value_target, "value_target"),
    ):
        _check_ppo_sample_values(t, name, ref, ref_name)
    _check(
        not normalize_advantage or ref.shape[0] >= 2,
        "normalize_advantage needs at least 2 samples (the std of one is undefined)",
    )
    _check(
        clip_coef >= 0 and math.isfinite(clip_coef),
        f"clip_coef must be a finite number >= 0, got {clip_coef}",
    )
    _check(
        value_clip is None or (value_clip >= 0 and math.isfinite(value_clip)),
        f"value_clip must be None or a finite number >= 0, got {value_clip}",
    )
    _check(math.isfinite(ent_coef), f"ent_coef must be finite, got {ent_coef}")
    _check(math.isfinite(vf_coef), f"vf_coef must be finite, got {vf_coef}")


def _ppo_outputs(policy):
    """(loss, stats [5], the policy input's derivative, the value's [M]) like new_ppo_outputs."""
    return (
        policy.new_empty(()),
        policy.new_empty(5),
        policy.new_empty(policy.shape),
        policy.new_empty(policy.shape[0]),
    )


@torch.library.register_fake("nostall::ppo_loss")
def _ppo_loss_fake(
    logits,
    action,
    value,
    old_log_prob,
    old_value,
    advantage,
    value_target,
    clip_coef,
    value_clip,
    ent_coef,
    vf_coef,
    normalize_advantage,
):
    _check(logits.dim() == 2, f"logits must be [M, A], got {logits.dim()} dimensions")
    _check(logits.dtype in FLOAT_DTYPES, f"logits must be float32 or float64, got {logits.dtype}")
    m, a = logits.shape
    _check(m >= 1 and a >= 1, f"logits must have M >= 1 and A >= 1, got [{m}, {a}]")
    _check(
        action.dim() == 1 and action.shape[0] == m and action.dtype == torch.int64,
        f"action must be int64 [M] = [{m}]",
    )
    _check(action.device == logits.device, "action must be on the device of logits")
    _check_ppo_targets_and_scalars(
        logits,
        "logits",
        value,
        old_log_prob,
        old_value,
        advantage,
        value_target,
        clip_coef,
        value_clip,
        ent_coef,
        vf_coef,
        normalize_advantage,
    )
    return _ppo_outputs(logits)


def _check_ppo_backward_args(grad_loss, grad_policy, grad_value, policy_name, dims):
    """The checks of both PPO loss backwards (ppo_loss.h); grad_policy is [M, A] or [M]."""
    shape = "[M, A]" if dims == 2 else "[M]"
    _check(
        grad_policy.dim() == dims and grad_policy.dtype in FLOAT_DTYPES,
        f"{policy_name} must be a float32 or float64 {shape} tensor",
    )
    m = grad_policy.shape[0]
    _check(
        grad_value.dim() == 1
        and grad_value.shape[0] == m
        and grad_value.dtype == grad_policy.dtype,
        f"grad_value must be [M] = [{m}] with the dtype of {policy_name}",
    )
    _check(
        grad_loss.dim() == 0 and grad_loss.dtype == grad_policy.dtype,
        f"grad_loss must be a scalar tensor with the dtype of {policy_name}",
    )
    _check(
        grad_loss.device == grad_policy.device and grad_value.device == grad_policy.device,
        f"grad_loss, {policy_name} and grad_value must be on one device",
    )


@torch.library.register_fake("nostall::ppo_loss_backward")
def _ppo_loss_backward_fake(grad_loss, grad_logits, grad_value):
    _check_ppo_backward_args(grad_loss, grad_logits, grad_value, "grad_logits", 2)
    return grad_logits.new_empty(grad_logits.shape), grad_value.new_empty(grad_value.shape)


@torch.library.register_fake("nostall::ppo_loss_from_log_prob")
def _ppo_loss_from_log_prob_fake(
    log_prob,
    entropy,
    value,
    old_log_prob,
    old_value,
    advantage,
    value_target,
    clip_coef,
    value_clip,
    ent_coef,
    vf_coef,
    normalize_advantage,
):
    _check(log_prob.dim() == 1, f"log_prob must be [M], got {log_prob.dim()} dimensions")
    _check(
        log_prob.dtype in FLOAT_DTYPES, f"log_prob must be float32 or float64, got {log_prob.dtype}"
    )
    _check(log_prob.shape[0] >= 1, "log_prob must have M >= 1 samples")
    _check_ppo_sample_values(entropy, "entropy", log_prob, "log_prob")
    _check_ppo_targets_and_scalars(
        log_prob,
        "log_prob",
        value,
        old_log_prob,
        old_value,
        advantage,
        value_target,
        clip_coef,
        value_clip,
        ent_coef,
        vf_coef,
        normalize_advantage,
    )
    return _ppo_outputs(log_prob)


@torch.library.register_fake("nostall::ppo_loss_from_log_prob_backward")
def _ppo_loss_from_log_prob_backward_fake(grad_loss, grad_log_prob, grad_value, ent_coef):
    _check_ppo_backward_args(grad_loss, grad_log_prob, grad_value, "grad_log_prob", 1)
    return tuple(grad_log_prob.new_empty(grad_log_prob.shape) for _ in range(3))
