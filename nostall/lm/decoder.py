"""A lean forward pass for Llama-family decoders (Qwen2, Llama, Mistral without a sliding
window), over the Hugging Face model's own parameters, with a static KV cache.

Why not call the `transformers` module: at the sizes RL on a CPU (or a small GPU model) runs,
its forward is mostly Python (mask builders, cache objects, output classes, hooks): several ms
a call for a 2-layer model, where the arithmetic takes a fraction of that. This module does the
same arithmetic (RMSNorm in float32, rotary embeddings from the model's own rotary module,
grouped-query attention, SwiGLU MLP) in a few dozen tensor ops a layer, reading the parameters
of the `transformers` model, so gradients, optimizers and `save_pretrained` all act on that
model. Tests check it against the `transformers` forward and `generate`.

Shapes are fixed per batch: the cache is [B, H_kv, S, D] per layer with S = prompt + new
tokens, and a decode step attends over all S slots with a mask (slots not yet written are
masked), writing its keys at a slot given as a device tensor. So a decode step has no
data-dependent shape and no host read, and can be compiled or captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    if getattr(config, "hidden_act", "silu") != "silu":
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("rope_type", "default") in ("default", "linear", "llama3")


def _rms_norm(x: Tensor, norm: torch.nn.Module) -> Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _causal_mask(key_mask: Tensor) -> Tensor:
    """[B, S, S]: query i sees key j <= i that is not padding (and a padding query sees itself,
    so its row is not all masked: that would give NaN)."""
    S = key_mask.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool, device=key_mask.device).tril()
    eye = torch.eye(S, dtype=torch.bool, device=key_mask.device)
    return (causal[None] & key_mask[:, None, :]) | eye[None]


class KVCache:
    """Preallocated keys and values, [B, H_kv, S, D] per layer."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, slots: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):  # fmt: skip
        shape = (num_layers, batch, kv_heads, slots, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.slots = slots


class Decoder:
    """The forward of a supported `transformers` causal LM (see `supports`)."""

    def __init__(self, model: torch.nn.Module):
        if not supports(model):
            raise ValueError(
                f"model type {getattr(model.config, 'model_type', '?')!r} is not a Llama-family "
                f"decoder this forward supports ({', '.join(SUPPORTED_MODEL_TYPES)}, no sliding "
                "window, SiLU, default/linear/llama3 rotary)"
            )
        self.model = model
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
        # Rotary tables for every position, from the model's own rotary module (its scaling).
        positions = torch.arange(config.max_position_embeddings, device=self.embed.weight.device)
        probe = torch.zeros(1, dtype=self.embed.weight.dtype, device=positions.device)
        with torch.no_grad():
            cos, sin = base.rotary_emb(probe, positions[None])
        self.cos, self.sin = cos[0], sin[0]  # (max_positions, head_dim)

    @property
    def output_weight(self) -> Tensor:
        return self.lm_head.weight

    def new_cache(self, batch: int, slots: int) -> KVCache:
        w = self.embed.weight
        return KVCache(len(self.layers), batch, self.kv_heads, slots, self.head_dim, w.dtype,
                       w.device)  # fmt: skip

    def _attention(self, layer, x: Tensor, positions: Tensor, mask: Tensor, cache: KVCache | None,
                   index: int, slot: Tensor | None) -> Tensor:  # fmt: skip
        attn = layer.self_attn
        B, S, _ = x.shape
        q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(B, S, -1, self.head_dim)
        k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(B, S, -1, self.head_dim)
        v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(B, S, -1, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, S, D)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (B, 1, S, D)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            if slot is None:  # prefill: the first S slots
                cache.keys[index, :, :, :S] = k
                cache.values[index, :, :, :S] = v
                keys, values = k, v
            else:  # one decode step at `slot` (a device tensor): all slots, masked
                cache.keys[index].index_copy_(2, slot, k)
                cache.values[index].index_copy_(2, slot, v)
                keys, values = cache.keys[index], cache.values[index]
        else:
            keys, values = k, v
        if self.groups > 1:
            keys = keys.repeat_interleave(self.groups, dim=1)
            values = values.repeat_interleave(self.groups, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        out = out.transpose(1, 2).reshape(B, S, -1)
        return F.linear(out, attn.o_proj.weight, attn.o_proj.bias)

    def _layers(self, ids: Tensor, positions: Tensor, mask: Tensor, cache: KVCache | None,
                slot: Tensor | None) -> Tensor:  # fmt: skip
        x = self.embed(ids)
        for index, layer in enumerate(self.layers):
            x = x + self._attention(
                layer, _rms_norm(x, layer.input_layernorm), positions, mask, cache, index, slot
            )
            h = _rms_norm(x, layer.post_attention_layernorm)
            mlp = layer.mlp
            x = x + F.linear(
                F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight),
                mlp.down_proj.weight,
            )
        return _rms_norm(x, self.norm)

    def hidden(self, ids: Tensor, key_mask: Tensor, positions: Tensor,
               cache: KVCache | None = None) -> Tensor:  # fmt: skip
        """Final (normed) hidden states [B, S, H] of whole sequences, differentiable: ids and
        positions [B, S], key_mask bool [B, S] (False: padding, never attended to). With
        `cache`, its first S slots are filled too (a prefill)."""
        return self._layers(ids, positions, _causal_mask(key_mask)[:, None], cache, None)

    def prefill(self, ids: Tensor, key_mask: Tensor, positions: Tensor, cache: KVCache) -> Tensor:
        """Fills the cache's first P slots from prompts [B, P]; the last position's logits."""
        hidden = self.hidden(ids, key_mask, positions, cache)
        return F.linear(hidden[:, -1], self.output_weight)

    def decode(self, token: Tensor, position: Tensor, slot: Tensor, slot_mask: Tensor,
               cache: KVCache) -> Tensor:  # fmt: skip
        """One step: token and position [B], slot a one-element int64 device tensor, slot_mask
        bool [B, S] (the keys this step may attend to, its own slot included); the logits
        [B, V]."""
        hidden = self._layers(token[:, None], position[:, None], slot_mask[:, None, None], cache,
                              slot)  # fmt: skip
        return F.linear(hidden[:, 0], self.output_weight)
