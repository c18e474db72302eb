"""What the lean decoder's attention is made of: the causal mask over padded rows, its additive
form, softmax(q k^T + bias) v in a handful of ops (the CPU flash-attention kernel costs hundreds
of microseconds a call at these sizes), and the static KV cache a decode step writes into."""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def causal_mask(key_mask: Tensor) -> Tensor:
    """[B, S, S]: query i sees key j <= i that is not padding (and a padding query sees itself,
    so its row is not all masked, which would give NaN)."""
    S = key_mask.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool, device=key_mask.device).tril()
    eye = torch.eye(S, dtype=torch.bool, device=key_mask.device)
    return (causal[None] & key_mask[:, None, :]) | eye[None]


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean attention mask as 0 / -inf, built once per forward and added in each layer."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )


def attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
    """softmax(q k^T * scale + bias) v over [B, heads, S, D]: a handful of ops, where the CPU
    flash-attention kernel costs hundreds of microseconds a call at these sizes."""
    return torch.matmul((torch.matmul(q, k.transpose(-1, -2)) * scale + bias).softmax(-1), v)


class KVCache:
    """Preallocated keys and values, [B, H_kv, S, D] per layer."""

    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        slots: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        shape = (num_layers, batch, kv_heads, slots, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.slots = slots
