"""A layer's fused projections (q, k, v stacked; gate and up stacked) without a copy where the
parameters are packed end to end in one buffer (nostall.lm.packing.pack_parameters): the parts'
concatenation as a view, with cat's gradient, or written into a buffer where they are not."""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def adjacent(parts: list[Tensor]) -> Tensor | None:
    """torch.cat(parts) as a view, when the parts lie end to end in one buffer (packed
    parameters: nostall.lm.packing.pack_parameters); None otherwise."""
    first = parts[0].detach()
    rows, offset = 0, first.storage_offset()
    for part in parts:
        if (
            not part.is_contiguous()
            or part.dtype != first.dtype
            or part.device != first.device
            or part.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or part.storage_offset() != offset
        ):
            return None
        rows += part.shape[0]
        offset += part.numel()
    return first.as_strided((rows, *first.shape[1:]), first.stride())


class AdjacentParts(torch.autograd.Function):
    """torch.cat(parts) for parts laid end to end in one buffer: their view in the forward,
    and in the backward cat's gradient (the incoming gradient's rows, as views, one a part)."""

    @staticmethod
    def forward(ctx, *parts: Tensor) -> Tensor:
        ctx.rows = [part.shape[0] for part in parts]
        return adjacent(list(parts))

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, ...]:
        return tuple(grad.split(ctx.rows))


def copy_rows(out: Tensor, parts: list[Tensor]) -> None:
    """out = torch.cat(parts), written in place (nothing to do when out is their view)."""
    if out.data_ptr() == parts[0].data_ptr() and adjacent(parts) is not None:
        return
    row = 0
    for part in parts:
        out[row : row + part.shape[0]].copy_(part)
        row += part.shape[0]
