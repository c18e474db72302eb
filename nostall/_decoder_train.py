"""decoder_train, the training forward of a Llama-family decoder over GRPO's grouped batch
(csrc/ops/decoder_train.h), decoder_train_backward and decoder_train_backward_into (the same
gradients into one flat buffer): their fake kernels and the autograd formula. nostall._native
registers them when it loads the library.

The formula is registered here, from Python, under any torch (the other ops' formulas are
native, in nostall._C_autograd): decoder_train runs once per update, so the registration's
Python cost (a few tens of microseconds) is noise against the op's milliseconds, and the backward
is itself the native op. The rotary tables are constants: asking for their gradient is an error.
"""

import torch

from nostall.decoder_weights import DecoderWeights


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)  # the C++ kernel's error type (STD_TORCH_CHECK)


def _shapes(op, prompt_ids, completion_ids, w: DecoderWeights):
    _check(prompt_ids.dim() == 2, f"{op}: prompt_ids must be int64 [Bp, P]")
    _check(completion_ids.dim() == 2, f"{op}: completion_ids must be int64 [B, C]")
    _check(
        w.embed.dtype in (torch.float32, torch.bfloat16), f"{op}: embed must be float32 or bfloat16"
    )
    _check(len(w.input_norm) >= 1, f"{op}: at least one layer")
    Bp, P = prompt_ids.shape
    B, C = completion_ids.shape
    N = Bp * P + B * (C - 1)  # a completion's last token is not run (decoder_train.h)
    return (
        B,
        C,
        P,
        N,
        len(w.input_norm),
        w.qkv_weight[0].shape[0],
        w.o_weight[0].shape[1],
        w.gate_up_weight[0].shape[0],
    )


# The weights come as DecoderWeights' nine arguments, then each op's own.
@torch.library.register_fake("nostall::decoder_train")
def _decoder_train_fake(prompt_ids, prompt_mask, completion_ids, completion_mask, *args):
    w, (_cos, _sin, num_heads, *_) = DecoderWeights.split(args)
    B, C, P, N, L, Q, A, I2 = _shapes("decoder_train", prompt_ids, completion_ids, w)
    H = w.embed.shape[1]

    def new(*shape):  # (float32 activations, whatever the weights' dtype)
        return w.embed.new_empty(shape, dtype=torch.float32)

    return (
        new(B * C, H),
        new((2 * L + 1) * N, H),
        new(L * N, Q),
        new(L * N, num_heads * (P + C - 1)),
        new(L * N, A),
        new(L * N, I2),
    )


@torch.library.register_fake("nostall::decoder_train_backward")
def _decoder_train_backward_fake(
    grad_hidden, prompt_ids, prompt_mask, completion_ids, completion_mask, *args
):
    w, _ = DecoderWeights.split(args)  # (then cos, sin, the activations, the sizes)
    _shapes("decoder_train_backward", prompt_ids, completion_ids, w)
    _check(
        grad_hidden.dtype == torch.float32, "decoder_train_backward: grad_hidden must be float32"
    )

    # The gradients are the weights' shapes: the embedding's, each list's, the final norm's.
    return tuple(
        torch.empty_like(x) if isinstance(x, torch.Tensor) else [torch.empty_like(t) for t in x]
        for x in w
    )


@torch.library.register_fake("nostall::decoder_train_backward_into")
def _decoder_train_backward_into_fake(
    grad_hidden, prompt_ids, prompt_mask, completion_ids, completion_mask, *args
):
    *rest, flat_grad, _accumulate = args
    w, _ = DecoderWeights.split(tuple(rest))  # (then cos, sin, the activations, the sizes)
    op = "decoder_train_backward_into"
    _shapes(op, prompt_ids, completion_ids, w)
    _check(grad_hidden.dtype == torch.float32, f"{op}: grad_hidden must be float32")
    total = sum(x.numel() if isinstance(x, torch.Tensor) else sum(t.numel() for t in x) for x in w)
    _check(
        flat_grad.dtype == w.embed.dtype and flat_grad.dim() == 1 and flat_grad.numel() == total,
        f"{op}: flat_grad must be a contiguous CPU {w.embed.dtype} [{total}] (every weight's "
        "gradient, in the op's output order)",
    )


def _setup_context(ctx, inputs, output):
    prompt_ids, prompt_mask, completion_ids, completion_mask, *args = inputs
    w, (cos, sin, num_heads, kv_heads, eps) = DecoderWeights.split(args)
    embed, lists, final_norm = w.embed, w[1:-1], w.final_norm
    # The activations are for the backward only: no gradient flows into them, and none is
    # materialised (five zero tensors the size of the activations, a millisecond a step).
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)
    ctx.sizes = [len(ts) for ts in lists]
    ctx.config = (num_heads, kv_heads, eps)
    ctx.save_for_backward(
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        embed,
        *[t for ts in lists for t in ts],
        final_norm,
        cos,
        sin,
        *output[1:],
    )


def _backward(ctx, grad_hidden, *_saved_grads):
    saved = list(ctx.saved_tensors)
    head, rest = saved[:5], saved[5:]
    lists = []
    for size in ctx.sizes:
        lists.append(rest[:size])
        rest = rest[size:]
    final_norm, cos, sin, *activations = rest
    rotary = len(ctx.needs_input_grad) - 5  # cos, sin: before the three numbers
    if ctx.needs_input_grad[rotary] or ctx.needs_input_grad[rotary + 1]:
        raise RuntimeError(
            "decoder_train: cos and sin get no gradient (the rotary tables are "
            "constants); pass them detached"
        )
    if grad_hidden is None:
        return (None,) * len(ctx.needs_input_grad)
    grads = torch.ops.nostall.decoder_train_backward.default(
        grad_hidden, *head, *lists, final_norm, cos, sin, *activations, *ctx.config
    )
    g_embed, *g_lists, g_final = grads  # (qkv_bias's list is empty when the model has none)
    return (None, None, None, None, g_embed, *g_lists, g_final, None, None, None, None, None)


torch.library.register_autograd("nostall::decoder_train", _backward, setup_context=_setup_context)
