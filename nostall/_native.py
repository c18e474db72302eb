"""Loads the native operator libraries, which register `torch.ops.nostall.*` on import.

`_C` (schemas and CPU kernels, stable ABI: any torch from 2.10 on) is required. `_C_autograd`
(autograd kernels, regular ABI) loads under the torch it was built for; under another torch the
same formulas are registered from Python instead (nostall._autograd_fallback), with a one-line
notice: every op works, each differentiable call costs about 0.1-0.5 ms more (forward and
backward; benchmarks/autograd_fallback.py). `AUTOGRAD` says
which is in use ("native" or "python"; NOSTALL_AUTOGRAD=python asks for the Python one).
`_C_cuda` exists only when nostall was built against a CUDA torch with a CUDA toolkit; under a
CUDA torch without it, every op's CUDA kernel is one that refuses the call with the build's reason
(no toolkit, say) and what to do, never silently and never the dispatcher's bare "could not run".
"""

import importlib
import importlib.util
import os
import sys
import warnings

import torch

from nostall.build_info import REBUILD, built_for, cuda_skipped


class AutogradFallbackWarning(UserWarning):
    """The native autograd kernels do not match this torch; the Python ones are in use."""


def _load_core() -> None:
    # _C is loaded with RTLD_GLOBAL: the CUDA library's environment step calls into the engine
    # and handle registry that live in _C (one registry, shared), and resolves them at load.
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | os.RTLD_GLOBAL)
    try:
        importlib.import_module("nostall._C")
    except (ImportError, OSError) as e:
        raise ImportError(
            f"nostall's native library cannot load under torch {torch.__version__} (built for "
            f"torch {built_for() or 'unknown: not built'}): {e}. Rebuild it against the torch "
            f"installed: {REBUILD}"
        ) from e
    finally:
        sys.setdlopenflags(flags)


def _load_autograd() -> str:
    """Returns "native" when _C_autograd loads (it attaches to the schemas _C defined), else
    "python"."""
    from nostall import _autograd_fallback

    if os.environ.get("NOSTALL_AUTOGRAD") == "python":
        _autograd_fallback.register()
        return "python"
    try:
        importlib.import_module("nostall._C_autograd")
        return "native"
    except (ImportError, OSError) as e:
        reason = str(e).splitlines()[0]
        reason = reason if len(reason) <= 160 else reason[:157] + "..."  # a mangled C++ symbol
    _autograd_fallback.register()
    warnings.warn(
        f"nostall: the native autograd kernels were built for torch {built_for() or 'unknown'} "
        f"and do not load under torch {torch.__version__} ({reason}); using the Python autograd "
        f"registrations (about 0.1-0.5 ms more per differentiable call). To rebuild: {REBUILD}",
        AutogradFallbackWarning,
        stacklevel=2,
    )
    return "python"


_load_core()
AUTOGRAD = _load_autograd()
from nostall import _decoder_train  # noqa: E402, F401  (its fakes and Python autograd formula)


def _refuse_cuda_calls(reason: str) -> torch.library.Library:
    """Registers, for every nostall op, a CUDA kernel that raises `reason`."""
    library = torch.library.Library("nostall", "IMPL")
    # (The dispatcher's list of every registered op: no public API lists a namespace's ops.)
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("nostall::")]
    for name in names:
        op = name.removeprefix("nostall::")

        def refuse(*args, _op=op, **kwargs):
            raise RuntimeError(
                f"nostall::{_op} was given CUDA tensors, but this nostall has no "
                f"CUDA kernels: {reason}"
            )

        library.impl(op, refuse, "CUDA")
    return library


def _load_cuda_kernels() -> bool:
    if torch.version.cuda is None:
        return False
    if importlib.util.find_spec("nostall._C_cuda") is None:
        reason = cuda_skipped() or (
            f"the CUDA library was not built or not installed; to build it: {REBUILD}"
        )
        global _CUDA_REFUSALS
        _CUDA_REFUSALS = _refuse_cuda_calls(reason)
        return False
    # A built but unloadable CUDA library is a broken install: let its ImportError surface.
    importlib.import_module("nostall._C_cuda")
    return True


_CUDA_REFUSALS: torch.library.Library | None = None  # (kept: the registrations live with it)
HAS_CUDA_KERNELS = _load_cuda_kernels()
