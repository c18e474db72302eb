"""Public operator functions. Importing this package registers the fake kernels and vmap rules
of the native ops (their autograd kernels are native, in nostall._C_autograd)."""

from nostall import _native  # noqa: F401  (loads the native library first)
from nostall.ops import _fake, _vmap  # noqa: F401  (registrations)
from nostall.ops.advantages import discounted_returns, gae, vtrace

__all__ = ["discounted_returns", "gae", "vtrace"]
