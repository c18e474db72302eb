"""A lean forward pass for Llama-family decoders (Qwen2, Llama, Mistral without a sliding
window), over the Hugging Face model's own parameters, with a static KV cache and prompts shared
by their group.

Why not call the `transformers` module: at the sizes RL on a CPU (or a small GPU model) runs,
its forward is mostly Python (mask builders, cache objects, output classes, hooks) and a CPU
flash-attention kernel with a high fixed cost: several ms a call for a 2-layer model, where the
arithmetic takes a fraction of that. This module does the same arithmetic (RMSNorm, rotary
embeddings from the model's own rotary module, grouped-query attention, SwiGLU MLP) in about
thirty tensor ops a layer, reading the parameters of the `transformers` model, so gradients,
optimizers and `save_pretrained` all act on that model. Tests check it against the
`transformers` forward and `generate`.

GRPO samples G completions of each prompt. The prompt is run once per group, not G times: its
keys and values are broadcast to the group's completions, in generation (the cache is filled
from the unique prompts) and in training (gradients from the G completions add up in the one
prompt pass). With 7 prompt and 5 completion tokens and G = 8, that halves the tokens a
training forward and backward touch.

Shapes are fixed per batch: the cache is [B, H_kv, S, D] per layer with S = prompt + new
tokens, and a decode step attends over all S slots with a mask (slots not yet written are
masked), writing its keys at a slot given as a device tensor. A decode step has no
data-dependent shape and no host read, so it can be compiled or captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nostall.decoder_weights import DecoderWeights
from nostall.lm.adjacent import AdjacentParts, adjacent, copy_rows
from nostall.lm.attention import KVCache, additive, attend, causal_mask

Tensor = torch.Tensor

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral")


def supports(model: torch.nn.Module) -> bool:
    """Whether `model` is a decoder this forward reproduces exactly."""
    config = model.config
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "use_sliding_window", False) or (
        config.model_type == "mistral" and getattr(config, "sliding_window", None)
    ):
        return False
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("rope_type", "default") in ("default", "linear", "llama3")


# The longest completions the update runs through the native decoder_train: past them torch's
# own ops (batched products for the attention) are faster. 135M shape, bf16 weights, 2 threads
# (python -m benchmarks.lm.decoder_lengths): native/torch 0.68 at 8 tokens, 1.02 at 64, 1.67
# at 128, 2.29 at 256.
NATIVE_TRAINING_TOKENS = 64


class Decoder:
    """The forward of a supported `transformers` causal LM (see `supports`)."""

    graphable = True  # a static cache: the decode step can be captured as a CUDA graph
    softcap = None  # (no model it supports caps its logits)

    def __init__(self, model: torch.nn.Module, native: bool = True):
        if not supports(model):
            raise ValueError(
                f"model type {getattr(model.config, 'model_type', '?')!r} is not a Llama-family "
                f"decoder this forward supports ({', '.join(SUPPORTED_MODEL_TYPES)}, no sliding "
                "window, SiLU, default/linear/llama3 rotary)"
            )
        self.model = model
        self.native = native  # prefill and decode steps as one native op each, where they apply
        config = model.config
        self.num_heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.groups = self.num_heads // self.kv_heads
        self.scale = self.head_dim**-0.5
        base = model.model
        self.embed = base.embed_tokens
        self.layers = list(base.layers)
        self.norm = base.norm
        self.lm_head = model.get_output_embeddings()
        # Rotary tables for every position, from the model's own rotary module (its scaling),
        # in float32 (the module computes them so, and casts to its input's dtype after): the
        # native ops' tables whatever the weights' dtype; the tensor ops' are them in that dtype.
        dtype = self.embed.weight.dtype
        positions = torch.arange(config.max_position_embeddings, device=self.embed.weight.device)
        probe = torch.zeros(1, dtype=torch.float32, device=positions.device)
        with torch.no_grad():
            cos, sin = base.rotary_emb(probe, positions[None])
        # rotate_half(x) * sin == x.roll(D / 2) * sin with its first half negated: one op less.
        half = self.head_dim // 2
        signed_sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)
        self.native_tables = (cos[0], signed_sin)  # (max_positions, head_dim) each
        self.cos, self.sin = cos[0].to(dtype), signed_sin.to(dtype)
        self._fused: list[tuple[Tensor, Tensor | None, Tensor]] | None = None
        self._native_weights: tuple | None = None

    def freeze(self) -> None:
        """For generation (no gradients): concatenates each layer's q/k/v and gate/up weights
        once, until the next `freeze` (call it after the weights change), instead of once per
        forward; where the parameters are packed end to end (`pack_parameters`) the fused
        weights are views of them and a refresh copies nothing. A refresh writes into the same
        buffers, so a captured CUDA graph that reads them stays valid."""
        with torch.no_grad():
            if self._fused is None:
                self._fused = [self._fuse(layer) for layer in self.layers]
                return
            # Each part copied straight into its rows: no concatenated temporaries (fresh
            # pages for every one of them made a refresh of a 4M-parameter model take 12 ms).
            # Fused weights that are views of the parts (packed parameters) need no copy.
            for (weight, bias, gate_up), layer in zip(self._fused, self.layers, strict=True):
                attn, mlp = layer.self_attn, layer.mlp
                projections = (attn.q_proj, attn.k_proj, attn.v_proj)
                copy_rows(weight, [p.weight for p in projections])
                if bias is not None:
                    copy_rows(bias, [p.bias for p in projections])
                copy_rows(gate_up, [mlp.gate_proj.weight, mlp.up_proj.weight])
        self._native_weights = None  # rebuilt on the next native step

    def _weight_lists(self) -> tuple:
        """decode_step's weight arguments, gathered once per freeze rather than per token (the
        tensors are the model's and the fused buffers themselves: later copies show through)."""
        if self._native_weights is None:
            weights = DecoderWeights.of(self, self._fused)
            self._native_weights = (*weights, self.output_weight, *self.native_tables)
        return self._native_weights

    def thaw(self) -> None:
        self._fused = None

    @staticmethod
    def _fuse(layer) -> tuple[Tensor, Tensor | None, Tensor]:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)

        def fused(parts: list[Tensor]) -> Tensor:
            view = adjacent(parts)
            if view is None:
                return torch.cat(parts)
            # Packed end to end: a view, with cat's gradient where one is taken (no copy of
            # every layer's weights kept for the backward, and none of their gradients).
            return AdjacentParts.apply(*parts) if torch.is_grad_enabled() else view

        bias = None
        if attn.q_proj.bias is not None:
            bias = fused([p.bias for p in projections])
        weight = fused([p.weight for p in projections])  # one GEMM for all three
        return weight, bias, fused([mlp.gate_proj.weight, mlp.up_proj.weight])

    def _weights(self, index: int) -> tuple[Tensor, Tensor | None, Tensor]:
        return self._fused[index] if self._fused is not None else self._fuse(self.layers[index])

    @property
    def output_weight(self) -> Tensor:
        return self.lm_head.weight

    def new_cache(self, batch: int, slots: int) -> KVCache:
        """A cache in the weights' dtype, or float32 where the native ops generate (their
        activations are float32 over bf16 weights too)."""
        w = self.embed.weight
        dtype = torch.float32 if self._native_kind() else w.dtype
        return KVCache(
            len(self.layers), batch, self.kv_heads, slots, self.head_dim, dtype, w.device
        )

    # -- pieces of a layer ---------------------------------------------------------------------
    @staticmethod
    def _norm(x: Tensor, norm: torch.nn.Module) -> Tensor:
        """RMSNorm as transformers computes it (F.rms_norm decomposes into ~20 ops on a CPU)."""
        if x.dtype != torch.float32:
            return F.rms_norm(x, x.shape[-1:], norm.weight, norm.variance_epsilon)
        return norm.weight * (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        )

    def _rotary(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and signed sin [B, S, 1, D] at positions [B, S], gathered once per forward."""
        return self.cos[positions][:, :, None], self.sin[positions][:, :, None]

    def _qkv(self, index: int, x: Tensor, rotary: tuple[Tensor, Tensor]) -> tuple[Tensor, ...]:
        """Rotated queries, keys and values [B, heads, S, D] of layer `index`, from its normed
        input x [B, S, H]."""
        B, S, _ = x.shape
        weight, bias, _ = self._weights(index)
        qkv = F.linear(x, weight, bias).view(B, S, -1, self.head_dim)
        heads = self.num_heads + self.kv_heads
        qk, v = qkv[:, :, :heads], qkv[:, :, heads:]
        cos, sin = rotary
        qk = qk * cos + qk.roll(self.head_dim // 2, -1) * sin
        q = qk[:, :, : self.num_heads].transpose(1, 2)
        k = qk[:, :, self.num_heads :].transpose(1, 2)
        return q, k, v.transpose(1, 2)

    def _expand_kv(self, t: Tensor) -> Tensor:
        return t if self.groups == 1 else t.repeat_interleave(self.groups, dim=1)

    def _out(self, index: int, x: Tensor, attended: Tensor) -> Tensor:
        """The residual stream of layer `index` after its attention output [B, heads, S, D]
        and its MLP."""
        layer = self.layers[index]
        B, _, S, _ = attended.shape
        o_proj = layer.self_attn.o_proj
        x = x + F.linear(attended.transpose(1, 2).reshape(B, S, -1), o_proj.weight, o_proj.bias)
        h = self._norm(x, layer.post_attention_layernorm)
        gate, up = F.linear(h, self._weights(index)[2]).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, layer.mlp.down_proj.weight)

    # -- whole sequences -----------------------------------------------------------------------
    def hidden(self, ids: Tensor, key_mask: Tensor, positions: Tensor) -> Tensor:
        """Final (normed) hidden states [B, S, H] of whole sequences, differentiable: ids and
        positions [B, S], key_mask bool [B, S] (False: padding, never attended to)."""
        x = self.embed(ids)
        bias = additive(causal_mask(key_mask)[:, None], x.dtype)
        rotary = self._rotary(positions)
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(index, self._norm(x, layer.input_layernorm), rotary)
            x = self._out(
                index, x, attend(q, self._expand_kv(k), self._expand_kv(v), bias, self.scale)
            )
        return self._norm(x, self.norm)

    def grouped_hidden(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
    ) -> Tensor:
        """The hidden states that predict each completion token, [B, C, H], differentiable.

        prompt_ids, prompt_mask [Bp, P] are each group's prompt (left-padded), completion_ids,
        completion_mask [B, C] the completions, B = Bp * G, grouped in order. The prompt is run
        once per group; its keys and values are broadcast to the group's completions."""
        if self._native_training_applies(completion_ids.shape[1]):
            B, C = completion_ids.shape
            hidden = torch.ops.nostall.decoder_train.default(
                prompt_ids,
                prompt_mask,
                completion_ids,
                completion_mask,
                *self._training_weights(),
                *self._native_config(),
            )[0]
            return hidden.view(B, C, -1)
        Bp, P = prompt_ids.shape
        G = completion_ids.shape[0] // Bp
        prompt_positions = (prompt_mask.long().cumsum(1) - 1).clamp(min=0)
        completion_positions = prompt_positions[:, -1:].repeat_interleave(
            G, 0
        ) + completion_mask.long().cumsum(1).clamp(min=1)
        xp, xc = self.embed(prompt_ids), self.embed(completion_ids)
        prompt_bias = additive(causal_mask(prompt_mask)[:, None], xp.dtype)  # (Bp, 1, P, P)
        C = completion_ids.shape[1]
        keys = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask], 1)
        completion_bias = additive(
            torch.cat([keys[:, None, :P].expand(-1, C, -1), causal_mask(completion_mask)], 2),
            xc.dtype,
        )[:, None]  # (B, 1, C, P + C)
        prompt_rotary = self._rotary(prompt_positions)
        completion_rotary = self._rotary(completion_positions)
        for index, layer in enumerate(self.layers):
            qp, kp, vp = self._qkv(index, self._norm(xp, layer.input_layernorm), prompt_rotary)
            qc, kc, vc = self._qkv(index, self._norm(xc, layer.input_layernorm), completion_rotary)
            kp, vp = self._expand_kv(kp), self._expand_kv(vp)
            kc, vc = self._expand_kv(kc), self._expand_kv(vc)
            xp_next = self._out(index, xp, attend(qp, kp, vp, prompt_bias, self.scale))
            k = torch.cat([kp.repeat_interleave(G, 0), kc], 2)
            v = torch.cat([vp.repeat_interleave(G, 0), vc], 2)
            xc = self._out(index, xc, attend(qc, k, v, completion_bias, self.scale))
            xp = xp_next
        last_prompt = self._norm(xp[:, -1:], self.norm).repeat_interleave(G, 0)  # (B, 1, H)
        return torch.cat([last_prompt, self._norm(xc[:, :-1], self.norm)], 1)

    # -- generation ----------------------------------------------------------------------------
    def prefill(
        self, prompt_ids: Tensor, prompt_mask: Tensor, cache: KVCache, group_size: int = 1
    ) -> Tensor:
        """Runs each group's prompt [Bp, P] once, writes its keys and values into the cache's
        first P slots of the group's G rows, and returns the next-token logits [Bp * G, V].
        On the CPU (generation, float32 or bf16 weights), one native op; elsewhere the ops
        below."""
        if self._native_applies():
            return torch.ops.nostall.prefill_prompts.default(
                prompt_ids,
                prompt_mask,
                group_size,
                *self._weight_lists(),
                cache.keys,
                cache.values,
                *self._native_config(),
            )
        P = prompt_ids.shape[1]
        rotary = self._rotary((prompt_mask.long().cumsum(1) - 1).clamp(min=0))
        x = self.embed(prompt_ids)
        bias = additive(causal_mask(prompt_mask)[:, None], x.dtype)
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(index, self._norm(x, layer.input_layernorm), rotary)
            cache.keys[index, :, :, :P] = k.repeat_interleave(group_size, 0)
            cache.values[index, :, :, :P] = v.repeat_interleave(group_size, 0)
            x = self._out(
                index, x, attend(q, self._expand_kv(k), self._expand_kv(v), bias, self.scale)
            )
        last = self._norm(x[:, -1], self.norm)
        return F.linear(last, self.output_weight).repeat_interleave(group_size, 0)

    def _native_kind(self) -> bool:
        """Whether the native ops cover this model: on the CPU, float32 or bf16 weights (bf16
        GEMMs, float32 between them), Llama's attention without an output bias."""
        return (
            self.native
            and self.layers[0].self_attn.o_proj.bias is None  # (Llama's attention_bias)
            and self.embed.weight.dtype in (torch.float32, torch.bfloat16)
            and self.embed.weight.device.type == "cpu"
        )

    def _native_applies(self) -> bool:
        """Whether the native ops (`nostall::decode_step`, `nostall::prefill_prompts`) run this
        model's generation: `_native_kind`, fused weights frozen, no gradients."""
        return self._native_kind() and self._fused is not None and not torch.is_grad_enabled()

    def _native_training_applies(self, length: int | None = None) -> bool:
        """Whether `nostall::decoder_train` runs `grouped_hidden` (forward and backward) of
        completions of `length` tokens (None: whether it could at some length): up to
        NATIVE_TRAINING_TOKENS, past which torch's batched attention products beat its
        per-position loops."""
        return self._native_kind() and (length is None or length <= NATIVE_TRAINING_TOKENS)

    def _training_weights(self) -> tuple:
        """decoder_train's weight arguments: the model's parameters (q/k/v and gate/up joined
        here, so their gradients flow back to the separate projections), the rotary tables."""
        fused = [self._fuse(layer) for layer in self.layers]
        return (*DecoderWeights.of(self, fused), *self.native_tables)

    def _native_config(self) -> tuple[int, int, float]:
        eps = float(self.layers[0].input_layernorm.variance_epsilon)
        return self.num_heads, self.kv_heads, eps

    def decode(
        self, token: Tensor, position: Tensor, slot: Tensor, slot_mask: Tensor, cache: KVCache
    ) -> Tensor:
        """One step: token and position [B], slot a one-element int64 device tensor (every
        row's) or [B] (each row's own: rows at their own lengths), slot_mask bool [B, S] (the
        keys this step may attend to, its own slot included); the logits
        [B, V]. On the CPU (generation, float32 or bf16 weights), one native op; elsewhere the
        ops below."""
        if self._native_applies():
            return torch.ops.nostall.decode_step.default(
                token,
                position,
                slot,
                slot_mask,
                *self._weight_lists(),
                cache.keys,
                cache.values,
                *self._native_config(),
            )
        x = self.embed(token[:, None])
        bias = additive(slot_mask[:, None, :, None], x.dtype)  # (B, 1, S, 1)
        rotary = self._rotary(position[:, None])
        # Each row at its own slot: (B, kv_heads, D) written at [b, :, slot[b]].
        rows = torch.arange(slot.shape[0], device=slot.device) if slot.numel() > 1 else None
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(index, self._norm(x, layer.input_layernorm), rotary)
            keys, values = cache.keys[index], cache.values[index]
            if rows is None:
                keys.index_copy_(2, slot, k)
                values.index_copy_(2, slot, v)
            else:
                keys[rows, :, slot] = k[:, :, 0]
                values[rows, :, slot] = v[:, :, 0]
            keys, values = self._expand_kv(keys), self._expand_kv(values)
            # One query: elementwise products and sums beat many tiny batched GEMMs.
            scores = (q * keys).sum(-1, keepdim=True) * self.scale + bias  # (B, heads, S, 1)
            weights = scores.softmax(-2)
            x = self._out(index, x, (weights * values).sum(-2, keepdim=True))
        return F.linear(self._norm(x[:, 0], self.norm), self.output_weight)
