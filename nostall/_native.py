"""Loads the native operator libraries, which register `torch.ops.nostall.*` on import.

`_C` (schemas and CPU kernels) and `_C_autograd` (autograd kernels) are always required.
`_C_cuda` exists only when nostall was built against a CUDA torch; without it a CUDA tensor
passed to an op fails in the dispatcher with "could not run 'nostall::...' with arguments from
the 'CUDA' backend", never silently.
"""

import importlib
import importlib.util
import os
import sys

import torch

from nostall.build_info import REBUILD, built_for


def _load_core() -> None:
    # _C is loaded with RTLD_GLOBAL: the CUDA library's environment step calls into the engine
    # and handle registry that live in _C (one registry, shared), and resolves them at load.
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | os.RTLD_GLOBAL)
    try:
        importlib.import_module("nostall._C")
        # The autograd kernels attach to schemas that _C defines.
        importlib.import_module("nostall._C_autograd")
    except (ImportError, OSError) as e:
        raise ImportError(
            f"nostall's native library cannot load under torch {torch.__version__} (built for "
            f"torch {built_for() or 'unknown: not built'}): {e}. Rebuild it against the torch "
            f"installed: {REBUILD}"
        ) from e
    finally:
        sys.setdlopenflags(flags)


_load_core()


def _load_cuda_kernels() -> bool:
    if torch.version.cuda is None or importlib.util.find_spec("nostall._C_cuda") is None:
        return False
    # A built but unloadable CUDA library is a broken install: let its ImportError surface.
    importlib.import_module("nostall._C_cuda")
    return True


HAS_CUDA_KERNELS = _load_cuda_kernels()
