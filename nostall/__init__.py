"""nostall: takes the waiting out of reinforcement-learning training loops on PyTorch.

Hot paths are C++ (and CUDA) kernels registered as PyTorch custom operators in the `nostall`
namespace (`torch.ops.nostall.*`); `nostall.ops` holds their documented Python entry points.
"""

from nostall import _native
from nostall.ops import discounted_returns, gae, vtrace

__version__ = "0.1.0"
HAS_CUDA_KERNELS = _native.HAS_CUDA_KERNELS

__all__ = ["HAS_CUDA_KERNELS", "discounted_returns", "gae", "vtrace"]
