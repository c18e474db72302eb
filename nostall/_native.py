"""Loads the native operator libraries, which register `torch.ops.nostall.*` on import.

`_C` (schemas and CPU kernels) is always required. `_C_cuda` exists only when nostall was built
against a CUDA torch; without it a CUDA tensor passed to an op fails in the dispatcher with
"could not run 'nostall::...' with arguments from the 'CUDA' backend", never silently.
"""

import importlib.util

import torch

from nostall import _C  # noqa: F401  (import registers the operators)


def _load_cuda_kernels() -> bool:
    if torch.version.cuda is None or importlib.util.find_spec("nostall._C_cuda") is None:
        return False
    # A built but unloadable CUDA library is a broken install: let its ImportError surface.
    from nostall import _C_cuda  # noqa: F401

    return True


HAS_CUDA_KERNELS = _load_cuda_kernels()
