"""Public operator functions. Importing this package registers the fake kernels and vmap rules
of the native ops (their autograd kernels are native, in nostall._C_autograd, but for
decoder_train's: nostall/_decoder_train.py says why)."""

from nostall import _native  # noqa: F401  (loads the native library first)
from nostall.ops import (  # noqa: F401  (registrations)
    _fake,
    _fake_losses,
    _fake_networks,
    _fake_optim,
    _fake_ppo,
    _fake_sampling,
    _vmap,
)
from nostall.ops.advantages import discounted_returns, gae, vtrace
from nostall.ops.losses import (
    PolicyLoss,
    PPOLoss,
    clipped_policy_loss,
    group_advantages,
    ppo_loss,
    ppo_loss_from_log_prob,
    token_entropy_linear,
    token_log_prob,
    token_log_prob_linear,
)
from nostall.ops.networks import mlp, sample_categorical
from nostall.ops.sampling import sample_tokens

__all__ = [
    "PPOLoss",
    "PolicyLoss",
    "clipped_policy_loss",
    "discounted_returns",
    "gae",
    "group_advantages",
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
