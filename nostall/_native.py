"""Loads the native operator libraries, which register `torch.ops.nostall.*` on import.

`_C` (schemas and CPU kernels) and `_C_autograd` (autograd kernels) are always required.
`_C_cuda` exists only when nostall was built against a CUDA torch; without it a CUDA tensor
passed to an op fails in the dispatcher with "could not run 'nostall::...' with arguments from
the 'CUDA' backend", never silently.
"""

import importlib
import importlib.util

import torch

# Order matters: the autograd kernels attach to schemas that _C defines.
importlib.import_module("nostall._C")
importlib.import_module("nostall._C_autograd")


def _load_cuda_kernels() -> bool:
    if torch.version.cuda is None or importlib.util.find_spec("nostall._C_cuda") is None:
        return False
    # A built but unloadable CUDA library is a broken install: let its ImportError surface.
    importlib.import_module("nostall._C_cuda")
    return True


HAS_CUDA_KERNELS = _load_cuda_kernels()
