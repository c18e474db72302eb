"""What forces a host-device sync: the catalog SyncWatch matches calls against.

Two layers, because some syncs never reach an ATen op on a CPU tensor (`.tolist()`, `.numpy()`,
`.cpu()`): Python-level tensor methods and torch functions (seen by a TorchFunctionMode), and
ATen ops (seen by a TorchDispatchMode). Each entry names the kind reported to the user.
"""

import os
import re
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
Tensor = torch.Tensor

# Python-level calls that read device data on the host. Matched on a device tensor argument.
FUNCTION_KINDS: dict[Callable, str] = {
    Tensor.item: "item",
    Tensor.__bool__: "bool",
    Tensor.__int__: "int",
    Tensor.__float__: "float",
    Tensor.__index__: "index",
    Tensor.tolist: "tolist",
    Tensor.numpy: "numpy",
    Tensor.__array__: "numpy",
    Tensor.cpu: "copy to host",
    Tensor.__repr__: "print",
    Tensor.__format__: "print",
    Tensor.__str__: "print",
    Tensor.__contains__: "contains",
    torch.allclose: "allclose",
    Tensor.allclose: "allclose",
    torch.equal: "equal",
    Tensor.equal: "equal",
}


# Calls that move a tensor between host and device; the watch decides which way by where the
# tensor lives and where the call sends it (sync.py, _FunctionLayer._move).
MOVES = frozenset({Tensor.to, Tensor.cuda})
# Factories that copy host data (a Python list, a NumPy array) into a new tensor: with a device
# target, a copy to the device from pageable memory.
DATA_FACTORIES = frozenset({torch.tensor, torch.as_tensor, torch.asarray})
# Factories that fill a new tensor: with a device target, a device tensor and no copy.
FILL_FACTORIES = frozenset(
    {
        torch.zeros,
        torch.ones,
        torch.empty,
        torch.empty_strided,
        torch.full,
        torch.arange,
        torch.range,
        torch.linspace,
        torch.logspace,
        torch.rand,
        torch.randn,
        torch.randint,
        torch.randperm,
        torch.normal,
        torch.eye,
        torch.tril_indices,
        torch.triu_indices,
        torch.zeros_like,
        torch.ones_like,
        torch.empty_like,
        torch.full_like,
        torch.rand_like,
        torch.randn_like,
        torch.randint_like,
    }
)


def move_target(func: Callable, args: tuple, kwargs: dict) -> torch.device | None:
    """The device a Tensor.to / Tensor.cuda call sends its tensor to; None for a dtype-only
    conversion."""
    if func is Tensor.cuda:
        device = args[1] if len(args) > 1 else kwargs.get("device")
        return torch.device("cuda" if device is None else device)
    for target in (*args[1:], kwargs.get("device")):
        if isinstance(target, Tensor):
            return target.device
        if isinstance(target, str | torch.device):
            try:
                return torch.device(target)
            except RuntimeError:
                return None
    return None


def non_blocking(func: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether a move asks for a non-blocking copy."""
    if kwargs.get("non_blocking", False):
        return True
    # Tensor.to(device, dtype, non_blocking) / to(dtype, non_blocking) / to(other, non_blocking)
    return any(a is True for a in args[1:])


# A host-side name of the CPU in the source of a call: `.to("cpu")`, `device="cpu"`,
# `torch.device("cpu")`. On a machine without CUDA a script's compute device is the CPU too, so
# a move's direction is read from how the call names its target.
NAMES_CPU = re.compile(r"""["']cpu["']|\.cpu\(""")


def _has_mask_index(indices: Any) -> bool:
    return any(
        isinstance(i, Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()
    )


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


# Advanced indexing: with integer indices on the host and data on the device, the indices are
# copied to the device first (sync.py, _DispatchLayer._host_indices).
INDEXING = frozenset({aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_})


def classify_op(func: Any, args: tuple, kwargs: dict) -> str | None:
    """The sync kind of an ATen op call with a device input, or None if it does not sync."""
    packet = func.overloadpacket
    if packet is aten._local_scalar_dense or packet is aten.is_nonzero:
        return "scalar read"
    if packet in (aten.nonzero, aten.argwhere):
        return "nonzero"
    if packet is aten.index and _has_mask_index(_arg(args, kwargs, 1, "indices")):
        return "boolean mask indexing"
    if packet in (aten.index_put, aten.index_put_, aten._index_put_impl_) and _has_mask_index(
        _arg(args, kwargs, 1, "indices")
    ):
        return "boolean mask assignment"
    if packet is aten.masked_select:
        return "masked_select"
    if packet in (
        aten._unique,
        aten._unique2,
        aten.unique_dim,
        aten.unique_consecutive,
        aten.unique_dim_consecutive,
    ):
        return "unique"
    if packet is aten.repeat_interleave and _arg(args, kwargs, 2, "output_size") is None:
        if func is aten.repeat_interleave.Tensor or func is aten.repeat_interleave.self_Tensor:
            return "repeat_interleave without output_size"
    if packet is aten.bincount:
        return "bincount"
    if packet is aten.histc:
        low, high = _arg(args, kwargs, 2, "min", 0), _arg(args, kwargs, 3, "max", 0)
        if low == high:
            return "histc without bounds"
    if packet is aten.equal:
        return "equal"
    if packet is aten.allclose:
        return "allclose"
    if packet is aten._linalg_check_errors:
        return "linalg error check"
    if packet is aten.multinomial and _arg(args, kwargs, 1, "num_samples") == 1:
        return "multinomial"
    if packet in (aten._to_copy, aten.copy_):
        return _device_to_host(func, args, kwargs)
    return None


def _device_to_host(func: Any, args: tuple, kwargs: dict) -> str | None:
    """A blocking copy from a CUDA tensor to the CPU (only on machines with CUDA)."""
    if func.overloadpacket is aten.copy_:
        dst, src = args[0], args[1]
        non_blocking = _arg(args, kwargs, 2, "non_blocking", False)
        if src.is_cuda and dst.device.type == "cpu" and not non_blocking:
            return "copy to host"
        return None
    src = args[0]
    device = kwargs.get("device")
    if src.is_cuda and device is not None and torch.device(device).type == "cpu":
        if not kwargs.get("non_blocking", False):
            return "copy to host"
    return None


# Frames under these directories are torch's (or the profiler's) own: a sync is reported at
# the first frame outside them, the user's line.
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
PROFILER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
INTERNAL_DIRS = (TORCH_DIR, PROFILER_DIR)
# A sync raised while torch.distributions validates its arguments gets its own kind.
DISTRIBUTIONS_DIR = os.path.join(TORCH_DIR, "distributions") + os.sep
# Where torch.distributions validates: Distribution.__init__ checks every parameter against its
# constraint, _validate_sample each sample given to log_prob.
VALIDATION_FUNCTIONS = frozenset({"__init__", "_validate_sample"})


def is_library(path: str) -> bool:
    """Whether a source file belongs to an installed package (not the user's own code)."""
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


# What removes each kind of sync, one line each (docs/sync_points.md shows each before and after;
# tests/profiler/test_fix_hints.py runs those snippets).
HINTS: dict[str, str] = {
    "item": "keep the value a tensor (accumulate on the device); read it every N steps under "
    "allow()",
    "bool": "branch on the device (torch.where), or check every N steps under allow()",
    "int": "keep it a tensor; size buffers by a static bound instead of a device count",
    "float": "keep it a tensor (accumulate on the device); read it every N steps under allow()",
    "index": "index with the tensor itself (index_select, gather), not a Python int",
    "tolist": "keep the values on the device; read a batch every N steps under allow()",
    "numpy": "copy into pinned memory with non_blocking=True and wait on an event when needed, "
    "or step the environment on the device (nostall.envs)",
    "copy to host": "copy into pinned memory with non_blocking=True and wait on an event when "
    "needed, or keep the consumer on the device",
    "copy to device": "copy from pinned memory with non_blocking=True (a reused pinned buffer: "
    "buf.copy_(x); x_dev.copy_(buf, non_blocking=True)), or create the data on the device",
    "print": "log every N steps under allow(), not every step",
    "contains": "(t == v).any() stays on the device",
    "nonzero": "a fixed-shape form: three-argument torch.where, masked_fill, "
    "nonzero_static(size=n)",
    "boolean mask indexing": "keep the shape: torch.where(mask, x, 0) and sums weighted by the "
    "mask",
    "boolean mask assignment": "x.masked_fill_(mask, v) or torch.where(mask, v, x)",
    "masked_select": "keep the shape: torch.where(mask, x, 0) and sums weighted by the mask",
    "unique": "a fixed-size mask or count over the known labels (scatter_ or scatter_add_ into "
    "a tensor of that size), or move it off the hot path",
    "repeat_interleave without output_size": "pass output_size= (the total, known on the host)",
    "bincount": "scatter_add_ into a tensor of fixed size (bincount still syncs with minlength)",
    "histc without bounds": "pass min= and max=",
    "equal": "(a == b).all() stays on the device",
    "allclose": "torch.isclose(a, b).all() stays on the device",
    "linalg error check": "the _ex variant (cholesky_ex, inv_ex, solve_ex); check info every N "
    "steps",
    "multinomial": "Gumbel-max: (logits - log(-log(u))).argmax(-1), or nostall.sample_categorical",
    "distributions validation": "validate_args=False on the distribution",
    "scalar read": "a Python number is read from a device tensor here: keep it a tensor",
}
