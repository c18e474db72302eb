"""The decoder's parameters in `decoder_train_backward`'s output order, laid end to end.

`training_order` lists the parameters as the native backward returns their gradients: the
embedding, each layer's input norm, each layer's q, k, v weights, their biases, the output
projections, the post-attention norms, gate and up weights, down weights, the final norm, then
an untied output weight. Kept in one flat buffer in that order (ClippedAdam's, or `pack`), each
layer's fused q/k/v (and gate/up) weight is one contiguous view, so neither the trainer's update
nor a generation copy's refresh concatenates anything.
"""

from __future__ import annotations

import torch

from nostall.lm.decoder import Decoder
from nostall.optim import pack


def training_order(decoder: Decoder) -> list[torch.nn.Parameter] | None:
    """The model's parameters in decoder_train_backward's output order, or None when the model
    has parameters that order does not cover, or runs through its own forward (the update then
    goes through autograd)."""
    if not isinstance(decoder, Decoder):
        return None
    layers = decoder.layers
    attn = [layer.self_attn for layer in layers]
    mlp = [layer.mlp for layer in layers]
    biases = [[a.q_proj.bias, a.k_proj.bias, a.v_proj.bias] for a in attn]
    present = {b is not None for bs in biases for b in bs}
    if len(present) > 1:
        return None  # some projections with a bias, some without: not decoder_train's layout
    order = [decoder.embed.weight]
    order += [layer.input_layernorm.weight for layer in layers]
    order += [p.weight for a in attn for p in (a.q_proj, a.k_proj, a.v_proj)]
    order += [b for bs in biases for b in bs if b is not None]
    order += [a.o_proj.weight for a in attn]
    order += [layer.post_attention_layernorm.weight for layer in layers]
    order += [p.weight for m in mlp for p in (m.gate_proj, m.up_proj)]
    order += [m.down_proj.weight for m in mlp]
    order.append(decoder.norm.weight)
    if decoder.output_weight is not decoder.embed.weight:
        order.append(decoder.output_weight)
    everything = list(decoder.model.parameters())
    if len(order) != len(everything) or {id(p) for p in order} != {id(p) for p in everything}:
        return None
    return order


def pack_parameters(decoder: Decoder) -> bool:
    """Lays the model's parameters end to end in one buffer, in `training_order` (as ClippedAdam
    does for the trainer's), so the decoder's fused q/k/v and gate/up weights are views too and
    a generation side's `freeze` copies nothing. False (nothing done) where the order does not
    cover the model or its parameters differ in dtype or device."""
    order = training_order(decoder)
    if order is None or len({(p.dtype, p.device) for p in order}) != 1:
        return False
    pack(order)
    decoder.thaw()  # fused weights built before now were copies
    return True
