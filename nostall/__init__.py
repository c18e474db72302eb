"""nostall: takes the waiting out of reinforcement-learning training loops on PyTorch.

Hot paths are C++ (and CUDA) kernels registered as PyTorch custom operators in the `nostall`
namespace (`torch.ops.nostall.*`); `nostall.ops` holds their documented Python entry points,
`nostall.envs` the native environments, `nostall.profiler` the sync-stall profiler (which
needs no native code). The trainers have two doors, the `nostall` command and the Python API:
`nostall.PPOTrainer`, `nostall.APPOTrainer` and `nostall.GRPOTrainer`, each with its config.
Importing nostall loads the native library, so `torch.ops.nostall.*` exist at once; if it
cannot load, `nostall.profiler` still works and the first use of an op raises the reason (the
torch version it was built for, and how to rebuild it). Subpackages load on first use.
"""

import importlib

__version__ = "0.1.0"

try:
    from nostall import _native  # noqa: F401  (registers torch.ops.nostall.*)

    NATIVE_ERROR: ImportError | None = None
except ImportError as _error:  # re-raised, with its reason, by the first import that needs it
    NATIVE_ERROR = _error

_LAZY = {
    "gae": "nostall.ops",
    "discounted_returns": "nostall.ops",
    "vtrace": "nostall.ops",
    "group_advantages": "nostall.ops",
    "token_log_prob": "nostall.ops",
    "token_log_prob_linear": "nostall.ops",
    "token_entropy_linear": "nostall.ops",
    "clipped_policy_loss": "nostall.ops",
    "PolicyLoss": "nostall.ops",
    "ppo_loss": "nostall.ops",
    "ppo_loss_from_log_prob": "nostall.ops",
    "PPOLoss": "nostall.ops",
    "mlp": "nostall.ops",
    "sample_categorical": "nostall.ops",
    "sample_tokens": "nostall.ops",
    "load_policy": "nostall.algos.ppo.policy",
    "PPOConfig": "nostall.algos.ppo",
    "PPOTrainer": "nostall.algos.ppo",
    "APPOConfig": "nostall.algos.appo",
    "APPOTrainer": "nostall.algos.appo",
    "GRPOConfig": "nostall.algos.grpo",
    "GRPOTrainer": "nostall.algos.grpo",
    "HAS_CUDA_KERNELS": "nostall._native",
    "AUTOGRAD": "nostall._native",
}


def __getattr__(name: str):
    # Lazy: `import nostall.profiler` must not load the native libraries.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nostall' has no attribute {name!r}")


__all__ = [
    "AUTOGRAD",
    "HAS_CUDA_KERNELS",
    "APPOConfig",
    "APPOTrainer",
    "GRPOConfig",
    "GRPOTrainer",
    "PPOConfig",
    "PPOLoss",
    "PPOTrainer",
    "PolicyLoss",
    "__version__",
    "clipped_policy_loss",
    "discounted_returns",
    "gae",
    "group_advantages",
    "load_policy",
    "mlp",
    "ppo_loss",
    "ppo_loss_from_log_prob",
    "sample_categorical",
    "sample_tokens",
    "token_entropy_linear",
    "token_log_prob",
    "token_log_prob_linear",
    "vtrace",
]
