"""Fake (meta) kernels of the loss ops, with the argument checks of csrc/ops/{group_advantages,
token_log_prob,policy_loss}.h (same messages, RuntimeError; ppo_loss's are in _fake_ppo.py).
Checks that read data (group, token and action indices in range) happen only in the real
kernels."""

import math

import torch

from nostall.ops._checks import FLOAT_DTYPES, INT64_MAX, _fail
from nostall.ops.losses import AGGREGATIONS, GROUP_SCALES

Tensor = torch.Tensor
LOGITS_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _check(ok: bool, message: str) -> None:
    if not ok:
        _fail(message)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# group_advantages ---------------------------------------------------------------------------


def _check_group_args(reward, group_index, num_groups, scale, eps):
    _check(reward.dim() == 1, f"reward must be a 1-D [N] tensor, got {reward.dim()} dimensions")
    _check(reward.dtype in FLOAT_DTYPES, f"reward must be float32 or float64, got {reward.dtype}")
    _check(reward.shape[0] >= 1, "reward must hold at least one reward")
    _check(group_index.dtype == torch.int64, f"group_index must be int64, got {group_index.dtype}")
    _check(
        group_index.dim() == 1 and group_index.shape[0] == reward.shape[0],
        f"group_index must have the shape of reward [{reward.shape[0]}]",
    )
    _check(group_index.device == reward.device, "group_index must be on the device of reward")
    _check(num_groups >= 1, f"num_groups must be >= 1, got {num_groups}")
    _check(
        num_groups < INT64_MAX // 3,
        f"num_groups = {num_groups} is too large: (num_groups + 1) * 3 statistics overflow int64",
    )
    _check(eps >= 0.0 and math.isfinite(eps), f"eps must be a finite number >= 0, got {eps}")
    _check(scale in GROUP_SCALES, f"scale must be 'group', 'batch' or 'none', got '{scale}'")


@torch.library.register_fake("nostall::group_advantages")
def _group_advantages_fake(reward, group_index, num_groups, scale, eps):
    _check_group_args(reward, group_index, num_groups, scale, eps)
    return reward.new_empty(reward.shape)


@torch.library.register_fake("nostall::group_advantages_backward")
def _group_advantages_backward_fake(grad_advantage, reward, group_index, num_groups, scale, eps):
    _check_group_args(reward, group_index, num_groups, scale, eps)
    _check(
        grad_advantage.dim() == 1 and grad_advantage.shape[0] == reward.shape[0],
        f"grad_advantage must have the shape of reward [{reward.shape[0]}]",
    )
    _check(grad_advantage.dtype == reward.dtype, "grad_advantage must have the dtype of reward")
    _check(grad_advantage.device == reward.device, "grad_advantage must be on the device of reward")
    return reward.new_empty(reward.shape)


# token_log_prob -----------------------------------------------------------------------------


def _check_tokens(tokens, ref, ref_name):
    _check(tokens.dtype == torch.int64, f"tokens must be int64, got {tokens.dtype}")
    _check(
        tokens.dim() == 2 and tuple(tokens.shape) == tuple(ref.shape[:2]),
        f"tokens must be [B, T] = [{ref.shape[0]}, {ref.shape[1]}], matching {ref_name}",
    )
    _check(tokens.device == ref.device, f"tokens must be on the device of {ref_name}")


def _check_logits_args(logits, tokens):
    _check(logits.dim() == 3, f"logits must be [B, T, V], got {logits.dim()} dimensions")
    _check(
        logits.dtype in LOGITS_DTYPES,
        f"logits must be float32, float64 or bfloat16, got {logits.dtype}",
    )
    _check(logits.shape[2] >= 1, "logits must have a vocabulary of at least one token")
    _check_tokens(tokens, logits, "logits")


def _check_row_values(t, name, ref, ref_name):
    _check(
        t.dim() == 2 and tuple(t.shape) == tuple(ref.shape[:2]),
        f"{name} must be [B, T] = [{ref.shape[0]}, {ref.shape[1]}], matching {ref_name}",
    )
    want = _accumulation_dtype(ref.dtype)
    _check(t.dtype == want, f"{name} must be {want}, got {t.dtype}")
    _check(t.device == ref.device, f"{name} must be on the device of {ref_name}")


def _check_hidden_and_weight(hidden, weight, chunk_size):
    _check(hidden.dim() == 3, f"hidden must be [B, T, H], got {hidden.dim()} dimensions")
    _check(
        hidden.dtype in LOGITS_DTYPES,
        f"hidden must be float32, float64 or bfloat16, got {hidden.dtype}",
    )
    _check(
        weight.dim() == 2 and weight.shape[1] == hidden.shape[2],
        f"weight must be [V, H] with H = {hidden.shape[2]} (the last dimension of hidden)",
    )
    _check(weight.shape[0] >= 1, "weight must have a vocabulary of at least one token")
    _check(
        weight.dtype == hidden.dtype,
        f"weight must have the dtype of hidden ({hidden.dtype}), got {weight.dtype}",
    )
    _check(weight.device == hidden.device, "weight must be on the device of hidden")
    _check(chunk_size >= 1, f"chunk_size must be >= 1, got {chunk_size}")


def _check_linear_args(hidden, weight, tokens, chunk_size):
    _check_hidden_and_weight(hidden, weight, chunk_size)
    _check_tokens(tokens, hidden, "hidden")


def _row_values(like):
    return like.new_empty(like.shape[:2], dtype=_accumulation_dtype(like.dtype))


@torch.library.register_fake("nostall::token_log_prob")
def _token_log_prob_fake(logits, tokens):
    _check_logits_args(logits, tokens)
    return _row_values(logits), _row_values(logits)


@torch.library.register_fake("nostall::token_log_prob_backward")
def _token_log_prob_backward_fake(grad_log_prob, logits, tokens, logsumexp):
    _check_logits_args(logits, tokens)
    _check_row_values(grad_log_prob, "grad_log_prob", logits, "logits")
    _check_row_values(logsumexp, "logsumexp", logits, "logits")
    return logits.new_empty(logits.shape)


@torch.library.register_fake("nostall::token_log_prob_linear")
def _token_log_prob_linear_fake(hidden, weight, tokens, chunk_size):
    _check_linear_args(hidden, weight, tokens, chunk_size)
    return _row_values(hidden), _row_values(hidden)


@torch.library.register_fake("nostall::token_log_prob_linear_backward")
def _token_log_prob_linear_backward_fake(
    grad_log_prob, hidden, weight, tokens, logsumexp, chunk_size
):
    _check_linear_args(hidden, weight, tokens, chunk_size)
    _check_row_values(grad_log_prob, "grad_log_prob", hidden, "hidden")
    _check_row_values(logsumexp, "logsumexp", hidden, "hidden")
    return hidden.new_empty(hidden.shape), weight.new_empty(weight.shape)


@torch.library.register_fake("nostall::token_entropy_linear")
def _token_entropy_linear_fake(hidden, weight, chunk_size):
    _check_hidden_and_weight(hidden, weight, chunk_size)
    return _row_values(hidden), _row_values(hidden)


@torch.library.register_fake("nostall::token_entropy_linear_backward")
def _token_entropy_linear_backward_fake(
    grad_entropy, hidden, weight, entropy, logsumexp, chunk_size
):
    _check_hidden_and_weight(hidden, weight, chunk_size)
    _check_row_values(grad_entropy, "grad_entropy", hidden, "hidden")
    _check_row_values(entropy, "entropy", hidden, "hidden")
    _check_row_values(logsumexp, "logsumexp", hidden, "hidden")
    return hidden.new_empty(hidden.shape), weight.new_empty(weight.shape)


# clipped_policy_loss ------------------------------------------------------------------------


def _check_token_values(t, name, ref, ref_name):
    _check(
        t.dim() == 2 and t.shape == ref.shape,
        f"{name} must be [B, T] = [{ref.shape[0]}, {ref.shape[1]}], matching {ref_name}",
    )
    _check(
        t.dtype == ref.dtype,
        f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}",
    )
    _check(t.device == ref.device, f"{name} must be on the device of {ref_name}")


def _check_aggregation(aggregation, max_tokens):
    _check(
        aggregation in AGGREGATIONS,
        "aggregation must be 'token_mean', 'seq_mean_token_mean' or "
        f"'seq_mean_token_sum_norm', got '{aggregation}'",
    )
    _check(max_tokens >= 1, f"max_tokens must be >= 1, got {max_tokens}")


def _check_loss_args(
    log_prob,
    old_log_prob,
    advantage,
    mask,
    clip_low,
    clip_high,
    aggregation,
    max_tokens,
    dual_clip,
    behavior_log_prob,
    is_cap,
):
    lp = log_prob
    _check(lp.dim() == 2, f"log_prob must be [B, T], got {lp.dim()} dimensions")
    _check(lp.dtype in FLOAT_DTYPES, f"log_prob must be float32 or float64, got {lp.dtype}")
    B, T = lp.shape
    _check(B >= 1 and T >= 1, f"log_prob must have B >= 1 and T >= 1, got [{B}, {T}]")
    _check_token_values(old_log_prob, "old_log_prob", lp, "log_prob")
    if behavior_log_prob is not None:
        _check_token_values(behavior_log_prob, "behavior_log_prob", lp, "log_prob")
    _check(
        advantage.dim() in (1, 2),
        "advantage must be [B] (one per sequence) or [B, T] (one per token), got "
        f"{advantage.dim()} dimensions",
    )
    _check(
        advantage.shape[0] == B and (advantage.dim() == 1 or advantage.shape[1] == T),
        f"advantage must be [B] = [{B}] or [B, T] = [{B}, {T}], matching log_prob",
    )
    _check(
        advantage.dtype == lp.dtype,
        f"advantage must have the dtype of log_prob ({lp.dtype}), got {advantage.dtype}",
    )
    _check(advantage.device == lp.device, "advantage must be on the device of log_prob")
    _check(mask.dtype == torch.bool, f"mask must be bool, got {mask.dtype}")
    _check(
        mask.dim() == 2 and mask.shape == lp.shape,
        f"mask must be [B, T] = [{B}, {T}], matching log_prob",
    )
    _check(mask.device == lp.device, "mask must be on the device of log_prob")
    _check(
        clip_low >= 0.0 and math.isfinite(clip_low),
        f"clip_low must be a finite number >= 0, got {clip_low}",
    )
    _check(
        clip_high >= 0.0 and math.isfinite(clip_high),
        f"clip_high must be a finite number >= 0, got {clip_high}",
    )
    _check(
        dual_clip is None or (dual_clip > 1.0 and math.isfinite(dual_clip)),
        f"dual_clip must be a finite number > 1, got {dual_clip}",
    )
    _check(
        is_cap > 0.0 and math.isfinite(is_cap), f"is_cap must be a finite number > 0, got {is_cap}"
    )
    _check_aggregation(aggregation, max_tokens)


@torch.library.register_fake("nostall::clipped_policy_loss")
def _clipped_policy_loss_fake(*args):
    _check_loss_args(*args)
    lp = args[0]
    return lp.new_empty(()), lp.new_empty(()), lp.new_empty(()), lp.new_empty(lp.shape)


@torch.library.register_fake("nostall::clipped_policy_loss_backward")
def _clipped_policy_loss_backward_fake(grad_loss, token_grad, mask, aggregation, max_tokens):
    _check(
        token_grad.dim() == 2 and token_grad.dtype in FLOAT_DTYPES,
        "token_grad must be a float32 or float64 [B, T] tensor",
    )
    _check(
        grad_loss.dim() == 0 and grad_loss.dtype == token_grad.dtype,
        "grad_loss must be a scalar tensor with the dtype of token_grad",
    )
    _check(grad_loss.device == token_grad.device, "grad_loss must be on the device of token_grad")
    _check(mask.dtype == torch.bool, f"mask must be bool, got {mask.dtype}")
    _check(
        mask.dim() == 2 and mask.shape == token_grad.shape, "mask must have the shape of token_grad"
    )
    _check(mask.device == token_grad.device, "mask must be on the device of token_grad")
    _check_aggregation(aggregation, max_tokens)
    return token_grad.new_empty(token_grad.shape)
