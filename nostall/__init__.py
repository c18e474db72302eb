"""nostall: takes the waiting out of reinforcement-learning training loops on PyTorch.

Hot paths are C++ (and CUDA) kernels registered as PyTorch custom operators in the `nostall`
namespace (`torch.ops.nostall.*`); `nostall.ops` holds their documented Python entry points,
`nostall.envs` the native environments, `nostall.profiler` the sync-stall profiler (which
loads no native code). Subpackages load on first use.
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "gae": "nostall.ops",
    "discounted_returns": "nostall.ops",
    "vtrace": "nostall.ops",
    "HAS_CUDA_KERNELS": "nostall._native",
}


def __getattr__(name: str):
    # Lazy: `import nostall.profiler` must not load the native libraries.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nostall' has no attribute {name!r}")


__all__ = ["HAS_CUDA_KERNELS", "__version__", "discounted_returns", "gae", "vtrace"]
