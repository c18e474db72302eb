"""vmap batching rules for the advantage ops.

Every op works column by column over time-major [T, N] tensors, so a batch of B problems is one
problem of width B*N: the rule folds the vmapped dimension into N, makes one native call, and
hands back a [T, B, N] view (out_dims=1) with no copy. The default rule would loop over B calls.
"""

import torch

_OPS = ("gae", "gae_backward", "discounted_returns", "discounted_returns_backward", "vtrace")


def _fold(arg, bdim, batch_size: int, name: str, op_name: str):
    """[T, N] with a batch dim anywhere -> [T, B*N], batch-major within each row."""
    if not isinstance(arg, torch.Tensor):
        return arg
    per_sample_dim = arg.dim() - (bdim is not None)
    if per_sample_dim != 2:
        raise RuntimeError(
            f"nostall::{op_name}: {name} must be a time-major [T, N] tensor, got "
            f"{per_sample_dim} dimensions"
        )
    if bdim is None:
        arg = arg.unsqueeze(1).expand(arg.shape[0], batch_size, arg.shape[1])
    else:
        arg = arg.movedim(bdim, 1)
    return arg.reshape(arg.shape[0], -1)


def _make_rule(op_name: str):
    op = getattr(torch.ops.nostall, op_name).default
    arg_names = [a.name for a in op._schema.arguments]

    def rule(info, in_dims, *args):
        batch = info.batch_size
        folded = [
            _fold(a, d, batch, n, op_name) for a, d, n in zip(args, in_dims, arg_names, strict=True)
        ]
        out = op(*folded)
        outs = out if isinstance(out, tuple) else (out,)
        unfolded = tuple(o.view(o.shape[0], batch, -1) for o in outs)
        if isinstance(out, tuple):
            return unfolded, (1,) * len(unfolded)
        return unfolded[0], 1

    return rule


for _name in _OPS:
    torch.library.register_vmap(f"nostall::{_name}", _make_rule(_name))
