"""The native decoder ops' weights, named once: `decode_step`, `prefill_prompts`,
`generate_completions`, `decoder_train` and `decoder_train_backward` all take these nine
arguments in this order (csrc/registration.cpp), so every Python builder and fake kernel
gathers or reads them through `DecoderWeights` rather than by position."""

from __future__ import annotations

from typing import NamedTuple

import torch

Tensor = torch.Tensor


class DecoderWeights(NamedTuple):
    """A Llama-family decoder's weights as the ops take them (lists hold one tensor a layer)."""

    embed: Tensor  # [V, H] the token embedding
    input_norm: list[Tensor]  # [H] RMSNorm before attention
    qkv_weight: list[Tensor]  # [(heads + 2 * kv_heads) * D, H] q, k, v projections stacked
    qkv_bias: list[Tensor]  # [(heads + 2 * kv_heads) * D], or an empty list: no biases
    o_weight: list[Tensor]  # [H, heads * D]
    post_norm: list[Tensor]  # [H] RMSNorm before the MLP
    gate_up_weight: list[Tensor]  # [2 * I, H] gate and up projections stacked
    down_weight: list[Tensor]  # [H, I]
    final_norm: Tensor  # [H]

    @classmethod
    def of(cls, decoder, fused: list[tuple[Tensor, Tensor | None, Tensor]]) -> DecoderWeights:
        """`decoder`'s weights (a nostall.lm.decoder.Decoder), with each layer's fused
        (qkv_weight, qkv_bias or None, gate_up_weight) from `fused`."""
        layers = decoder.layers
        biases = [bias for _, bias, _ in fused]
        return cls(
            decoder.embed.weight,
            [layer.input_layernorm.weight for layer in layers],
            [weight for weight, _, _ in fused],
            [] if biases[0] is None else biases,
            [layer.self_attn.o_proj.weight for layer in layers],
            [layer.post_attention_layernorm.weight for layer in layers],
            [gate_up for _, _, gate_up in fused],
            [layer.mlp.down_proj.weight for layer in layers],
            decoder.norm.weight,
        )

    def detached(self) -> DecoderWeights:
        """The same tensors without autograd history (the explicit update's arguments)."""
        return DecoderWeights(
            *(w.detach() if isinstance(w, Tensor) else [t.detach() for t in w] for w in self)
        )

    @classmethod
    def split(cls, args: tuple) -> tuple[DecoderWeights, tuple]:
        """A fake kernel's arguments from the weights on: (the weights, what follows them)."""
        n = len(cls._fields)
        return cls(*args[:n]), tuple(args[n:])
