"""Every native decoder op declares the decoder's weights as DecoderWeights (the Python side)
names them: the same names, in the same order, each a tensor or a list of them as there, and
decoder_train_backward returns a gradient of each in that order. The C++ side writes them once
(csrc/ops/decoder_weights.h); a weight added, removed or renamed on one side only fails here."""

import pytest
import torch

from nostall import _native  # noqa: F401  (loads the native library)
from nostall.decoder_weights import DecoderWeights

DECODER_OPS = [
    "decode_step",
    "prefill_prompts",
    "generate_completions",
    "decoder_train",
    "decoder_train_backward",
    "decoder_train_backward_into",
]


def _kind(annotation) -> str:  # (a NamedTuple keeps a postponed annotation as a ForwardRef)
    text = getattr(annotation, "__forward_arg__", str(annotation))
    return "Tensor[]" if text.startswith("list") else "Tensor"


def _schema_kind(argument) -> str:
    return "Tensor[]" if str(argument.type).startswith("List") else str(argument.type)


@pytest.mark.parametrize("op", DECODER_OPS)
def test_each_decoder_op_takes_the_weights_as_decoder_weights_names_them(op):
    arguments = getattr(torch.ops.nostall, op).default._schema.arguments
    names = [a.name for a in arguments]
    first = names.index(DecoderWeights._fields[0])
    weights = arguments[first : first + len(DecoderWeights._fields)]
    assert [a.name for a in weights] == list(DecoderWeights._fields)
    kinds = [_kind(DecoderWeights.__annotations__[name]) for name in DecoderWeights._fields]
    assert [_schema_kind(a) for a in weights] == kinds


def test_the_backward_returns_each_weights_gradient_in_order():
    returns = torch.ops.nostall.decoder_train_backward.default._schema.returns
    assert [r.name for r in returns] == [f"grad_{name}" for name in DecoderWeights._fields]
    kinds = [_kind(DecoderWeights.__annotations__[name]) for name in DecoderWeights._fields]
    assert [_schema_kind(r) for r in returns] == kinds
