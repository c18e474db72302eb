"""A catalog of code snippets, each with the host-device syncs it must produce.

Every snippet runs with `d`, a tensor computed from a parameter (it would live on the device),
`A`, a positive-definite device matrix, and `h`, a host tensor built from host data. Clean
look-alikes must produce no sync.
"""

import numpy as np
import torch

# (name, code, expected count, expected kind or None)
SYNCING = [
    ("item", "d.sum().item()", 1, "item"),
    ("bool", "bool(d.sum() > 0)", 1, "bool"),
    ("if_tensor", "if d.sum() > 0:\n    pass", 1, "bool"),
    ("int", "int(d[0])", 1, "int"),
    ("float", "float(d[0])", 1, "float"),
    ("index_dunder", "list(range(10))[d.argmax()]", 1, "index"),
    ("tolist", "d.tolist()", 1, "tolist"),
    ("numpy", "d.detach().numpy()", 1, "numpy"),
    ("np_asarray", "np.asarray(d.detach())", 1, "numpy"),
    ("cpu", "d.cpu()", 1, "copy to host"),
    ("to_cpu", "d.to('cpu')", 1, "copy to host"),
    ("to_device_cpu_kw", "d.to(device=torch.device('cpu'))", 1, "copy to host"),
    # A read of the host copy is not a second sync.
    ("cpu_numpy", "d.detach().cpu().numpy()", 1, "copy to host"),
    ("cpu_tolist", "d.cpu().tolist()", 1, "copy to host"),
    ("to_cpu_item", "d.sum().to('cpu').item()", 1, "copy to host"),
    ("cpu_then_later_read", "x = d.cpu()\nx.sum().item()", 1, "copy to host"),
    ("cpu_then_read_source", "x = d.cpu()\nd.sum().item()", 2, None),
    ("print", "str(d)", 1, "print"),
    ("format", "f'{d.sum():.2f}'", 1, "print"),
    ("contains", "2.0 in d", 1, "contains"),
    ("nonzero", "d.nonzero()", 1, "nonzero"),
    ("torch_nonzero", "torch.nonzero(d > 0)", 1, "nonzero"),
    ("where_one_arg", "torch.where(d > 0)", 1, "nonzero"),
    ("argwhere", "torch.argwhere(d)", 1, "nonzero"),
    ("mask_index", "d[d > 0]", 1, "boolean mask indexing"),
    ("mask_assign", "x = d.detach().clone()\nx[x > 0] = 0.0", 1, "boolean mask assignment"),
    ("masked_select", "torch.masked_select(d, d > 0)", 1, "masked_select"),
    ("unique", "torch.unique(d)", 1, "unique"),
    ("unique_counts", "d.unique(return_counts=True)", 1, "unique"),
    ("unique_consecutive", "torch.unique_consecutive(d)", 1, "unique"),
    (
        "repeat_interleave",
        "torch.repeat_interleave(d, (d > 0).long() + 1)",
        1,
        "repeat_interleave without output_size",
    ),
    ("bincount", "torch.bincount((d.detach() > 0).long())", 1, "bincount"),
    ("histc", "torch.histc(d.detach())", 1, "histc without bounds"),
    ("equal", "torch.equal(d, d)", 1, "equal"),
    ("allclose", "torch.allclose(d, d)", 1, "allclose"),
    ("cholesky", "torch.linalg.cholesky(A)", 1, "linalg error check"),
    ("inv", "torch.linalg.inv(A)", 1, "linalg error check"),
    ("multinomial", "torch.multinomial(d.softmax(0), 1)", 1, "multinomial"),
    (
        "categorical_validation",
        "torch.distributions.Categorical(logits=d, validate_args=True)",
        1,
        "distributions validation",
    ),
    (
        # Sampling is the distribution's own work, not its validation: the multinomial's kind.
        "categorical_sample",
        "torch.distributions.Categorical(logits=d, validate_args=False).sample()",
        1,
        "multinomial",
    ),
    (
        # A sample given back to log_prob is validated.
        "categorical_log_prob_validation",
        "c = torch.distributions.Categorical(logits=d, validate_args=False)\n"
        "c._validate_args = True\nc.log_prob(d.argmax())",
        1,
        "distributions validation",
    ),
    # Host data on its way to the device: copied from pageable memory, blocking.
    ("host_index", "d[torch.tensor([0, 2])]", 1, "copy to device"),
    ("to_device", "torch.tensor([1.0, 2.0]).to(d.device)", 1, "copy to device"),
    (
        "data_factory_on_device",
        "torch.as_tensor([1.0, 2.0], device=d.device)",
        1,
        "copy to device",
    ),
    ("item_in_loop", "for _ in range(3):\n    d.sum().item()", 3, "item"),
    ("any_item", "(d > 0).any().item()", 1, "item"),
    (
        "mask_index_backward",
        "loss = d[d > 0].sum()\nloss.backward()",
        2,
        None,  # forward: mask indexing; backward: mask assignment
    ),
]

CLEAN = [
    ("sum", "d.sum()"),
    ("where_three_args", "torch.where(d > 0, d, 0.0)"),
    ("masked_fill", "d.masked_fill(d > 0, 0.0)"),
    ("nonzero_static", "torch.nonzero_static(d > 0, size=8)"),
    ("repeat_interleave_sized", "torch.repeat_interleave(d, 2, output_size=16)"),
    ("histc_bounded", "torch.histc(d.detach(), bins=4, min=-1, max=1)"),
    ("host_item", "h.sum().item()"),
    ("host_if", "if h.sum() > 0:\n    pass"),
    ("host_mask", "h[h > 0]"),
    ("gumbel_max", "(d - torch.log(-torch.log(torch.rand_like(d)))).argmax(-1)"),
    ("metadata", "d.shape[0] + len(d) + d.numel() + d.dim()"),
    ("dtype_cast", "d.to(torch.float64)"),
    ("long_index", "d[torch.arange(0, 4, 2, device=d.device)]"),
    ("move_to_where_it_is", "d.to(d.device)"),  # transformers' mask.to(device=x.device)
    ("fill_factory_on_device", "torch.zeros(3, device=d.device) + d[:3]"),
    ("host_data_stays_on_host", "torch.tensor([1.0, 2.0]).sum().item()"),
    ("slice", "d[2:5]"),
    ("cat", "torch.cat([d, d])"),
    ("device_normaliser", "d.sum() / (d > 0).sum().clamp(min=1)"),
    (
        "categorical_unvalidated",
        "torch.distributions.Categorical(logits=d, validate_args=False).log_prob(torch.tensor(1))",
    ),
    ("cholesky_ex", "torch.linalg.cholesky_ex(A)"),
    ("module_to_device", "torch.nn.Linear(8, 2).to(torch.device('cpu'))"),
    (
        "clip_grad_norm",
        "(w * w).sum().backward()\ntorch.nn.utils.clip_grad_norm_([w], 0.5)",
    ),
    (
        "adam_step_counter",
        "opt = torch.optim.Adam([w], lr=0.1)\n(w * w).sum().backward()\nopt.step()",
    ),
]


def snippet_namespace(w: torch.nn.Parameter) -> dict:
    g = torch.Generator().manual_seed(0)
    m = torch.nn.Parameter(torch.randn(4, 4, generator=g))
    return {
        "torch": torch,
        "np": np,
        "w": w,
        "d": w * 1.0,
        "A": m @ m.T + torch.eye(4),
        "h": torch.arange(8.0) - 3,
    }
