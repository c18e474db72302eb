"""Fake (meta) kernels of the generation ops: sample_tokens, with the argument checks of
csrc/ops/sample_tokens.h (same messages, RuntimeError), decode_step and prefill_prompts: under
torch.compile they run instead of the C++ ones."""

import math

import torch

from nostall.decoder_weights import DecoderWeights
from nostall.ops._checks import FLOAT_DTYPES, _fail, checked_product

NATIVE_WEIGHT_DTYPES = (torch.float32, torch.bfloat16)  # (the logits are float32 either way)


def _check(ok: bool, message: str) -> None:
    if not ok:
        _fail(message)


@torch.library.register_fake("nostall::sample_tokens")
def _sample_tokens_fake(
    logits, uniform, finished, allowed, temperature, top_k, top_p, eos_token_id, pad_token_id
):
    _check(logits.dim() == 2, f"logits must be [B, V], got {logits.dim()} dimensions")
    _check(logits.dtype in FLOAT_DTYPES, f"logits must be float32 or float64, got {logits.dtype}")
    b, v = logits.shape
    _check(v >= 1, "logits must have at least one token")
    _check(uniform.shape == logits.shape, f"uniform must have the shape of logits [{b}, {v}]")
    _check(
        uniform.dtype == logits.dtype,
        f"uniform must have the dtype of logits ({logits.dtype}), got {uniform.dtype}",
    )
    _check(uniform.device == logits.device, "uniform must be on the device of logits")
    _check(finished.dtype == torch.bool, f"finished must be bool, got {finished.dtype}")
    _check(finished.dim() == 1 and finished.shape[0] == b, f"finished must be [B] = [{b}]")
    _check(finished.device == logits.device, "finished must be on the device of logits")
    _check(allowed.dtype == torch.bool, f"allowed must be bool, got {allowed.dtype}")
    _check(allowed.dim() == 1 and allowed.shape[0] == v, f"allowed must be [V] = [{v}]")
    _check(allowed.device == logits.device, "allowed must be on the device of logits")
    _check(
        temperature > 0 and math.isfinite(temperature),
        f"temperature must be a positive finite number, got {temperature}",
    )
    _check(top_k >= 0, f"top_k must be >= 0 (0: no top-k), got {top_k}")
    _check(0.0 < top_p <= 1.0, f"top_p must lie in (0, 1], got {top_p}")
    _check(0 <= eos_token_id < v, f"eos_token_id must lie in [0, {v}), got {eos_token_id}")
    _check(0 <= pad_token_id < v, f"pad_token_id must lie in [0, {v}), got {pad_token_id}")
    return logits.new_empty(b, dtype=torch.int64), logits.new_empty(b)


# The decoder ops' weights come as DecoderWeights' nine arguments, then each op's own.
@torch.library.register_fake("nostall::decode_step")
def _decode_step_fake(token, position, slot, slot_mask, *args):
    w, (lm_head, *_) = DecoderWeights.split(args)  # (then cos, sin, the cache, its sizes)
    _check(token.dim() == 1, "decode_step: token must be int64 [B]")
    _check(w.embed.dtype in NATIVE_WEIGHT_DTYPES, "decode_step: embed must be float32 or bfloat16")
    return w.embed.new_empty(token.shape[0], lm_head.shape[0], dtype=torch.float32)


@torch.library.register_fake("nostall::prefill_prompts")
def _prefill_prompts_fake(prompt_ids, prompt_mask, group_size, *args):
    w, (lm_head, *_) = DecoderWeights.split(args)
    _check(prompt_ids.dim() == 2, "prefill_prompts: prompt_ids must be int64 [Bp, P]")
    _check(group_size >= 1, f"prefill_prompts: group_size must be at least 1, got {group_size}")
    _check(
        w.embed.dtype in NATIVE_WEIGHT_DTYPES, "prefill_prompts: embed must be float32 or bfloat16"
    )
    rows = checked_product(prompt_ids.shape[0], group_size, "prefill_prompts", "Bp * group_size")
    return w.embed.new_empty(rows, lm_head.shape[0], dtype=torch.float32)


@torch.library.register_fake("nostall::generate_completions")
def _generate_completions_fake(prompt_ids, prompt_mask, group_size, uniform, allowed, *_args):
    # (_args: the DecoderWeights, lm_head, cos, sin, the cache, its sizes, the sampling; the
    # outputs' shapes need none of them)
    _check(prompt_ids.dim() == 2, "generate_completions: prompt_ids must be a CPU int64 [Bp, P]")
    _check(
        group_size >= 1, f"generate_completions: group_size must be at least 1, got {group_size}"
    )
    B = checked_product(prompt_ids.shape[0], group_size, "generate_completions", "Bp * group_size")
    _check(
        uniform.dim() == 3 and uniform.dtype == torch.float32 and uniform.shape[1] == B,
        f"generate_completions: uniform must be a CPU float32 [C, B, V] with C >= 1 and B = {B}",
    )
    C = uniform.shape[0]
    return (
        prompt_ids.new_empty(B, C),
        prompt_mask.new_empty(B, C),
        uniform.new_empty(B, C),
    )
