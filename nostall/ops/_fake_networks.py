"""Fake (meta) kernels of mlp, mlp_backward and sample_categorical, with the argument checks of
csrc/ops/{mlp,sample_categorical}.h (same messages, RuntimeError)."""

import torch

from nostall.ops._checks import FLOAT_DTYPES, _fail
from nostall.ops.networks import ACTIVATIONS


def _check(ok: bool, message: str) -> None:
    if not ok:
        _fail(message)


def _check_activation(activation: str) -> None:
    _check(activation in ACTIVATIONS, f"activation must be 'tanh' or 'relu', got '{activation}'")


def _check_input(input) -> None:
    _check(input.dim() == 2, f"input must be [M, K], got {input.dim()} dimensions")
    _check(input.dtype in FLOAT_DTYPES, f"input must be float32 or float64, got {input.dtype}")


def _check_weight(i: int, w, width: int, input) -> None:
    why = "the last dimension of input" if i == 0 else "the previous layer's width"
    _check(
        w.dim() == 2 and w.shape[1] == width, f"weights[{i}] must be a [J, {width}] matrix ({why})"
    )


@torch.library.register_fake("nostall::mlp")
def _mlp_fake(input, weights, biases, activation):
    _check_activation(activation)
    _check_input(input)
    _check(len(weights) >= 1, "weights must hold at least one layer")
    _check(
        len(biases) == len(weights),
        f"biases must have one tensor per weight ({len(weights)}), got {len(biases)}",
    )
    width = input.shape[1]
    outputs = []
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        _check_weight(i, w, width, input)
        _check(w.shape[0] >= 1, f"weights[{i}] must have at least one output unit")
        _check(
            b.dim() == 1 and b.shape[0] == w.shape[0],
            f"biases[{i}] must be [{w.shape[0]}], matching weights[{i}]",
        )
        _check(
            w.dtype == input.dtype and b.dtype == input.dtype,
            f"weights[{i}] and biases[{i}] must have the dtype of input ({input.dtype})",
        )
        _check(
            w.device == input.device and b.device == input.device,
            f"weights[{i}] and biases[{i}] must be on the device of input",
        )
        width = w.shape[0]
        outputs.append(input.new_empty(input.shape[0], width))
    return outputs[-1], outputs[:-1]


@torch.library.register_fake("nostall::mlp_backward")
def _mlp_backward_fake(grad_output, input, weights, hidden, activation, input_grad):
    _check_activation(activation)
    _check_input(input)
    _check(len(weights) >= 1, "weights must hold at least one layer")
    _check(
        len(hidden) + 1 == len(weights),
        f"hidden must hold {len(weights) - 1} activations (one per layer but the last), "
        f"got {len(hidden)}",
    )
    M, width = input.shape
    for i, w in enumerate(weights):
        _check_weight(i, w, width, input)
        _check(
            w.dtype == input.dtype and w.device == input.device,
            f"weights[{i}] must have the dtype and device of input",
        )
        width = w.shape[0]
        if i + 1 < len(weights):
            h = hidden[i]
            _check(
                h.dim() == 2 and tuple(h.shape) == (M, width),
                f"hidden[{i}] must be [{M}, {width}]",
            )
            _check(
                h.dtype == input.dtype and h.device == input.device,
                f"hidden[{i}] must have the dtype and device of input",
            )
    _check(
        grad_output.dim() == 2 and tuple(grad_output.shape) == (M, width),
        f"grad_output must be [{M}, {width}], the output's shape",
    )
    _check(
        grad_output.dtype == input.dtype and grad_output.device == input.device,
        "grad_output must have the dtype and device of input",
    )
    grad_input = input.new_empty(input.shape) if input_grad else None
    grad_weights = [w.new_empty(w.shape) for w in weights]
    grad_biases = [w.new_empty(w.shape[0]) for w in weights]
    return grad_input, grad_weights, grad_biases


@torch.library.register_fake("nostall::sample_categorical")
def _sample_categorical_fake(logits, uniform):
    _check(logits.dim() == 2, f"logits must be [N, A], got {logits.dim()} dimensions")
    _check(logits.dtype in FLOAT_DTYPES, f"logits must be float32 or float64, got {logits.dtype}")
    _check(logits.shape[1] >= 1, "logits must have at least one action")
    n, a = logits.shape
    _check(uniform.shape == logits.shape, f"uniform must have the shape of logits [{n}, {a}]")
    _check(
        uniform.dtype == logits.dtype,
        f"uniform must have the dtype of logits ({logits.dtype}), got {uniform.dtype}",
    )
    _check(uniform.device == logits.device, "uniform must be on the device of logits")
    return logits.new_empty(n), logits.new_empty(n, dtype=torch.int64), logits.new_empty(n)
