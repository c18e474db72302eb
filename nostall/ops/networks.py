"""Policy networks and sampling as native operators.

:func:`mlp` evaluates a multilayer perceptron (the Linear-Tanh-Linear-Tanh-Linear policy and
value networks of classic-control RL) in one call, forward and backward. At rollout batch sizes
each of the dozen eager ops of such a network costs more in dispatch than in arithmetic; the
native op runs the tiny layers as direct loops, the large ones through BLAS / cuBLAS, with the
activation fused, and its backward is one native call too. :func:`sample_categorical` draws
actions from a categorical policy by Gumbel-max with no host sync, and gives their
log-probabilities from the same pass.
"""

from collections.abc import Sequence

import torch
from torch import nn

from nostall import _native  # noqa: F401  (loads the native library first)

Tensor = torch.Tensor

ACTIVATIONS = ("tanh", "relu")
_mlp_op = torch.ops.nostall.mlp.default
_sample_op = torch.ops.nostall.sample_categorical.default
_MODULE_ACTIVATIONS = {nn.Tanh: "tanh", nn.ReLU: "relu"}


def mlp(
    input: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    activation: str = "tanh",
) -> Tensor:
    """`act(... act(input @ W_1^T + b_1) ...) @ W_L^T + b_L`, the activation after every layer
    but the last.

    Args:
        input: `[..., K]` float32/float64.
        weights: `W_i` of shape `[J_i, J_{i-1}]` (`nn.Linear.weight`'s layout), `J_0 = K`.
        biases: `b_i` of shape `[J_i]`.
        activation: `"tanh"` or `"relu"`.

    Returns:
        `[..., J_L]`. Differentiable in input, weights and biases (once: no second derivative).
    """
    if input.dim() == 2:  # the common case first: this sits on the per-step path
        return _mlp_op(input, weights, biases, activation)[0]
    out = _mlp_op(input.reshape(-1, input.shape[-1]), weights, biases, activation)[0]
    return out.view(*input.shape[:-1], out.shape[-1])


def sample_categorical(
    logits: Tensor, generator: torch.Generator | None = None, uniform: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(action, log_prob): one Gumbel-max sample per row of `[N, A]` logits and its
    log-probability, with no host sync (`Categorical.sample()` reads scalars back on CUDA).

    The noise is `torch.rand` from `generator` on the logits' device, or `uniform` when given
    (`[N, A]`, in `[0, 1)`). The action is int64 `[N]`; log_prob (`[N]`, the logits' dtype) is
    differentiable in the logits.
    """
    if uniform is None:
        uniform = torch.rand(
            logits.shape, generator=generator, dtype=logits.dtype, device=logits.device
        )
    log_prob, action, _ = _sample_op(logits, uniform)
    return action, log_prob


def sequential_layers(net: nn.Sequential) -> tuple[list[Tensor], list[Tensor], str]:
    """(weights, biases, activation) of an `nn.Sequential` of `Linear` layers with one kind of
    activation (`Tanh` or `ReLU`) between them, for :func:`mlp`; ValueError for anything else."""
    modules = list(net)
    linears, activations = modules[0::2], modules[1::2]
    kinds = {type(m) for m in activations}
    if (
        not linears
        or len(activations) != len(linears) - 1
        or not all(type(m) is nn.Linear and m.bias is not None for m in linears)
        or len(kinds) > 1
        or not kinds <= set(_MODULE_ACTIVATIONS)
    ):
        raise ValueError(
            "expected Linear layers (with bias) alternating with one kind of activation "
            f"(Tanh or ReLU), ending with a Linear; got {net}"
        )
    activation = _MODULE_ACTIVATIONS[kinds.pop()] if kinds else "tanh"
    return [m.weight for m in linears], [m.bias for m in linears], activation
