"""decoder_train, the training forward of a Llama-family decoder over GRPO's grouped batch
(csrc/ops/decoder_train.h), and decoder_train_backward: their fake kernels and the autograd
formula. nostall._native registers them when it loads the library.

The formula is registered here, from Python, under any torch (the other ops' formulas are
native, in nostall._C_autograd): decoder_train runs once per update, so the registration's
Python cost (a few tens of microseconds) is noise against the op's milliseconds, and the backward
is itself the native op. The rotary tables are constants: asking for their gradient is an error.
"""

import torch


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)  # the C++ kernel's error type (STD_TORCH_CHECK)


def _shapes(op, prompt_ids, completion_ids, embed, input_norm, qkv_weight, o_weight,
            gate_up_weight):  # fmt: skip
    _check(prompt_ids.dim() == 2, f"{op}: prompt_ids must be int64 [Bp, P]")
    _check(completion_ids.dim() == 2, f"{op}: completion_ids must be int64 [B, C]")
    _check(embed.dtype == torch.float32, f"{op}: embed must be float32")
    _check(len(input_norm) >= 1, f"{op}: at least one layer")
    Bp, P = prompt_ids.shape
    B, C = completion_ids.shape
    N = Bp * P + B * (C - 1)  # a completion's last token is not run (decoder_train.h)
    return (
        B,
        C,
        P,
        N,
        len(input_norm),
        qkv_weight[0].shape[0],
        o_weight[0].shape[1],
        (gate_up_weight[0].shape[0]),
    )


@torch.library.register_fake("nostall::decoder_train")
def _decoder_train_fake(prompt_ids, prompt_mask, completion_ids, completion_mask, embed,
                        input_norm, qkv_weight, qkv_bias, o_weight, post_norm, gate_up_weight,
                        down_weight, final_norm, cos, sin, num_heads, kv_heads, eps):  # fmt: skip
    B, C, P, N, L, Q, A, I2 = _shapes("decoder_train", prompt_ids, completion_ids, embed,
                                      input_norm, qkv_weight, o_weight, gate_up_weight)  # fmt: skip
    H = embed.shape[1]
    return (
        embed.new_empty(B * C, H),
        embed.new_empty((2 * L + 1) * N, H),
        embed.new_empty(L * N, Q),
        embed.new_empty(L * N, num_heads * (P + C - 1)),
        embed.new_empty(L * N, A),
        embed.new_empty(L * N, I2),
    )


@torch.library.register_fake("nostall::decoder_train_backward")
def _decoder_train_backward_fake(grad_hidden, prompt_ids, prompt_mask, completion_ids,
                                 completion_mask, embed, input_norm, qkv_weight, qkv_bias,
                                 o_weight, post_norm, gate_up_weight, down_weight, final_norm,
                                 cos, sin, residuals, qkv, probs, attended, gate_up, num_heads,
                                 kv_heads, eps):  # fmt: skip
    _shapes("decoder_train_backward", prompt_ids, completion_ids, embed, input_norm, qkv_weight,
            o_weight, gate_up_weight)  # fmt: skip
    _check(grad_hidden.dtype == torch.float32,
           "decoder_train_backward: grad_hidden must be float32")  # fmt: skip

    def like(ts):
        return [torch.empty_like(t) for t in ts]

    return (
        torch.empty_like(embed),
        like(input_norm),
        like(qkv_weight),
        like(qkv_bias),
        like(o_weight),
        like(post_norm),
        like(gate_up_weight),
        like(down_weight),
        torch.empty_like(final_norm),
    )


def _setup_context(ctx, inputs, output):
    prompt_ids, prompt_mask, completion_ids, completion_mask, embed = inputs[:5]
    lists = inputs[5:12]
    final_norm, cos, sin, num_heads, kv_heads, eps = inputs[12:]
    # The activations are for the backward only: no gradient flows into them, and none is
    # materialised (five zero tensors the size of the activations, a millisecond a step).
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)
    ctx.sizes = [len(ts) for ts in lists]
    ctx.config = (num_heads, kv_heads, eps)
    ctx.save_for_backward(prompt_ids, prompt_mask, completion_ids, completion_mask, embed,
                          *[t for ts in lists for t in ts], final_norm, cos, sin,
                          *output[1:])  # fmt: skip


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
        raise RuntimeError("decoder_train: cos and sin get no gradient (the rotary tables are "
                           "constants); pass them detached")  # fmt: skip
    if grad_hidden is None:
        return (None,) * len(ctx.needs_input_grad)
    grads = torch.ops.nostall.decoder_train_backward.default(
        grad_hidden, *head, *lists, final_norm, cos, sin, *activations, *ctx.config
    )
    g_embed, *g_lists, g_final = grads  # (qkv_bias's list is empty when the model has none)
    return (None, None, None, None, g_embed, *g_lists, g_final, None, None, None, None, None)


torch.library.register_autograd("nostall::decoder_train", _backward, setup_context=_setup_context)
