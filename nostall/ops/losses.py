"""Policy-gradient loss operators for language-model RL (GRPO, Dr. GRPO) and PPO, as native
custom operators.

- :func:`group_advantages`: reward minus its group's mean, optionally over the group's (or the
  batch's) standard deviation.
- :func:`token_log_prob`: log-probabilities of chosen tokens from `[B, T, V]` logits, without the
  `[B, T, V]` log-softmax; :func:`token_log_prob_linear` the same from hidden states and the
  output weight, computing the logits a chunk of rows at a time.
- :func:`token_entropy_linear`: each token's entropy under the softmax of its logits, the same
  way (an entropy bonus for GRPO).
- :func:`clipped_policy_loss`: the clipped surrogate with GRPO / Dr. GRPO / token-mean
  aggregation, optional dual clip and truncated importance weights, plus the clip fraction and
  approximate KL as device tensors.
- :func:`ppo_loss`: the whole PPO loss of a categorical actor-critic minibatch (clipped
  surrogate, clipped value loss, entropy bonus, advantage normalisation) in one op;
  :func:`ppo_loss_from_log_prob` the same for any policy distribution, from its
  log-probabilities and entropies.

Each runs on the device of its inputs with no host sync, traces under
`torch.compile(fullgraph=True)`, and has a native backward.
"""

from typing import NamedTuple

import torch

from nostall.ops.advantages import _scalar, _tensors

Tensor = torch.Tensor

# The accepted string arguments (the C++ kernels parse the same names; the fakes check them).
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
GROUP_SCALES = ("group", "batch", "none")

# Logits per chunk of the linear variant by default: 4M (16 MB in float32), small next to the
# [B, T, V] logits of a real batch and large enough that each chunk is an efficient GEMM.
DEFAULT_CHUNK_LOGITS = 1 << 22


class PolicyLoss(NamedTuple):
    loss: Tensor
    """The aggregated surrogate loss, a scalar tensor (differentiable in log_prob)."""
    clip_fraction: Tensor
    """Share of unmasked tokens whose gradient a clip cut (a scalar tensor, for logging)."""
    approx_kl: Tensor
    """Token mean of (ratio - 1) - log(ratio), the k3 estimate of KL(old || new)."""


def _int(x: int, name: str) -> int:
    if isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a Python int, not a tensor")
    return int(x)


def group_advantages(
    reward: Tensor,
    group_index: Tensor,
    num_groups: int,
    scale: str | bool = "group",
    eps: float = 1e-4,
) -> Tensor:
    """GRPO group-relative advantages (Shao et al. 2024); Dr. GRPO with `scale="none"`.

    Args:
        reward: `[N]` float32/float64 rewards, one per completion.
        group_index: int64 `[N]`, the group (prompt) of each completion, in `[0, num_groups)`.
            Groups may differ in size. On CUDA an index out of range gives NaN advantages for
            its completions (checking it would need a host sync); on the CPU it raises.
        num_groups: number of groups (passed in, so no shape depends on data).
        scale: `"group"` divides by the group's standard deviation + eps (GRPO), `"batch"` by
            the batch's, `"none"` does not divide (Dr. GRPO). `True`/`False` mean
            `"group"`/`"none"`.
        eps: added to the standard deviation (TRL uses 1e-4).

    Returns:
        `[N]` advantages; a group of one gets exactly 0. Differentiable in reward.
    """
    _tensors(reward=reward, group_index=group_index)
    if isinstance(scale, bool):
        scale = "group" if scale else "none"
    return torch.ops.nostall.group_advantages.default(
        reward, group_index, _int(num_groups, "num_groups"), scale, _scalar(eps, "eps")
    )


def token_log_prob(logits: Tensor, tokens: Tensor) -> Tensor:
    """`log_softmax(logits)` gathered at `tokens`, with float32 accumulation.

    Args:
        logits: `[B, T, V]` float32, bfloat16 or float64.
        tokens: int64 `[B, T]` in `[0, V)` (on CUDA an out-of-range token gives NaN).

    Returns:
        `[B, T]` log-probabilities, float32 (float64 for float64 logits). Differentiable in
        logits; the backward writes `[B, T, V]` gradients directly, with no log-softmax saved.
    """
    _tensors(logits=logits, tokens=tokens)
    return torch.ops.nostall.token_log_prob.default(logits, tokens)[0]


def token_log_prob_linear(
    hidden: Tensor, weight: Tensor, tokens: Tensor, chunk_size: int | None = None
) -> Tensor:
    """:func:`token_log_prob` of `hidden @ weight.T`, without ever holding the full logits.

    Args:
        hidden: `[B, T, H]` final hidden states (float32, bfloat16 or float64).
        weight: `[V, H]` output (unembedding) weight, the dtype of hidden.
        tokens: int64 `[B, T]` in `[0, V)`.
        chunk_size: rows of logits (`[chunk_size, V]`) computed at a time; default: about
            4M logits per chunk.

    Returns:
        `[B, T]` log-probabilities (float32, or float64). Differentiable in hidden and weight;
        the backward recomputes each chunk's logits, so peak memory stays near
        `chunk_size * V` instead of `B * T * V`.
    """
    _tensors(hidden=hidden, weight=weight, tokens=tokens)
    if chunk_size is None:
        vocab = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() >= 1 else 1
        chunk_size = max(1, DEFAULT_CHUNK_LOGITS // max(1, vocab))
    return torch.ops.nostall.token_log_prob_linear.default(
        hidden, weight, tokens, _int(chunk_size, "chunk_size")
    )[0]


def token_entropy_linear(hidden: Tensor, weight: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy of each position's next-token distribution `softmax(hidden @ weight.T)`, without
    ever holding the full logits.

    Args:
        hidden: `[B, T, H]` final hidden states (float32, bfloat16 or float64); divide them by
            the sampling temperature first for the entropy of the tempered distribution.
        weight: `[V, H]` output (unembedding) weight, the dtype of hidden.
        chunk_size: rows of logits (`[chunk_size, V]`) computed at a time; default: about
            4M logits per chunk.

    Returns:
        `[B, T]` entropies in nats (float32, or float64). Differentiable in hidden and weight;
        the backward recomputes each chunk's logits, as :func:`token_log_prob_linear`'s does.
    """
    _tensors(hidden=hidden, weight=weight)
    if chunk_size is None:
        vocab = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() >= 1 else 1
        chunk_size = max(1, DEFAULT_CHUNK_LOGITS // max(1, vocab))
    return torch.ops.nostall.token_entropy_linear.default(
        hidden, weight, _int(chunk_size, "chunk_size")
    )[0]


def clipped_policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantage: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    aggregation: str = "token_mean",
    max_tokens: int | None = None,
    *,
    dual_clip: float | None = None,
    behavior_log_prob: Tensor | None = None,
    is_cap: float = 2.0,
) -> PolicyLoss:
    """The PPO / GRPO clipped surrogate loss over `[B, T]` tokens.

    Args:
        log_prob: `[B, T]` log-probabilities of the sampled tokens under the current policy
            (float32/float64; the only differentiated input).
        old_log_prob: `[B, T]` the same under the policy the ratio is taken against.
        advantage: `[B]` (one per sequence, as in GRPO) or `[B, T]`.
        mask: bool `[B, T]`, True for tokens that count (masked tokens may hold anything,
            NaN included).
        clip_low, clip_high: the ratio is clipped to `[1 - clip_low, 1 + clip_high]`;
            `clip_high` defaults to `clip_low` (DAPO's clip-higher sets it larger).
        aggregation: `"token_mean"` (mean over all unmasked tokens), `"seq_mean_token_mean"`
            (GRPO: per-sequence token mean, then the mean over sequences) or
            `"seq_mean_token_sum_norm"` (Dr. GRPO: the token sum over `B * max_tokens`).
        max_tokens: Dr. GRPO's constant normaliser, >= 1; default: T.
        dual_clip: for negative advantages, caps the loss at `-dual_clip * A` (Ye et al. 2020);
            must be > 1. None: off.
        behavior_log_prob: `[B, T]` log-probabilities under the policy that generated the data
            (asynchronous rollouts); each token's loss is weighted by
            `min(exp(old_log_prob - behavior_log_prob), is_cap)`, a constant.
        is_cap: the truncation of that importance weight, > 0.

    Returns:
        :class:`PolicyLoss` of scalar tensors on the inputs' device; normalisers never leave
        the device.
    """
    _tensors(log_prob=log_prob, old_log_prob=old_log_prob, advantage=advantage, mask=mask)
    if clip_high is None:
        clip_high = clip_low
    if max_tokens is None:
        is_tensor = isinstance(log_prob, torch.Tensor)
        max_tokens = log_prob.shape[-1] if is_tensor and log_prob.dim() >= 1 else 1
    loss, clip_fraction, approx_kl, _ = torch.ops.nostall.clipped_policy_loss.default(
        log_prob,
        old_log_prob,
        advantage,
        mask,
        _scalar(clip_low, "clip_low"),
        _scalar(clip_high, "clip_high"),
        aggregation,
        _int(max_tokens, "max_tokens"),
        None if dual_clip is None else _scalar(dual_clip, "dual_clip"),
        behavior_log_prob,
        _scalar(is_cap, "is_cap"),
    )
    return PolicyLoss(loss, clip_fraction, approx_kl)


class PPOLoss(NamedTuple):
    loss: Tensor
    """pg_loss - ent_coef * entropy + vf_coef * v_loss, a scalar (differentiable in the logits
    and the value)."""
    pg_loss: Tensor
    """The clipped surrogate's mean (a scalar tensor, for logging)."""
    v_loss: Tensor
    """Half the mean (clipped) squared value error."""
    entropy: Tensor
    """The policy's mean entropy."""
    approx_kl: Tensor
    """Mean of (ratio - 1) - log(ratio), the k3 estimator of KL(old || new)."""
    clip_fraction: Tensor
    """Share of samples whose policy gradient a clip cut."""
    stats: Tensor
    """The five statistics above as one `[5]` tensor (they are its views): one add to
    accumulate them."""


def _ppo_scalars(clip_coef, value_clip, ent_coef, vf_coef, normalize_advantage) -> tuple:
    """The scalar arguments of both PPO loss ops, as their schemas take them."""
    return (
        _scalar(clip_coef, "clip_coef"),
        None if value_clip is None else _scalar(value_clip, "value_clip"),
        _scalar(ent_coef, "ent_coef"),
        _scalar(vf_coef, "vf_coef"),
        bool(normalize_advantage),
    )


def ppo_loss(
    logits: Tensor,
    action: Tensor,
    value: Tensor,
    old_log_prob: Tensor,
    old_value: Tensor,
    advantage: Tensor,
    value_target: Tensor,
    clip_coef: float = 0.2,
    value_clip: float | None = 0.2,
    ent_coef: float = 0.01,
    vf_coef: float = 0.5,
    normalize_advantage: bool = True,
) -> PPOLoss:
    """The PPO loss of a categorical actor-critic over a minibatch of M samples, as CleanRL's
    ppo.py computes it, in one op forward and one backward.

    Args:
        logits: `[M, A]` the policy's logits (float32/float64; differentiated).
        action: int64 `[M]` the actions taken, in `[0, A)`.
        value: `[M]` the critic's values (differentiated).
        old_log_prob, old_value: `[M]` log-probabilities and values of the policy and critic
            the chunk is trained against (targets).
        advantage, value_target: `[M]` (targets).
        clip_coef: the ratio is clipped to `[1 - clip_coef, 1 + clip_coef]`.
        value_clip: the value's change from old_value is clipped to this in the value loss
            (PPO's clipped value loss); None: the plain squared error.
        ent_coef, vf_coef: weights of the entropy bonus and the value loss.
        normalize_advantage: normalise the advantages to zero mean and unit std over the
            minibatch (needs M >= 2).

    Returns:
        PPOLoss; every field a scalar tensor on the logits' device (no host sync).
    """
    _tensors(
        logits=logits,
        action=action,
        value=value,
        old_log_prob=old_log_prob,
        old_value=old_value,
        advantage=advantage,
        value_target=value_target,
    )
    loss, stats, _, _ = torch.ops.nostall.ppo_loss.default(
        logits,
        action,
        value,
        old_log_prob,
        old_value,
        advantage,
        value_target,
        *_ppo_scalars(clip_coef, value_clip, ent_coef, vf_coef, normalize_advantage),
    )
    return PPOLoss(loss, *stats.unbind(), stats)


def ppo_loss_from_log_prob(
    log_prob: Tensor,
    entropy: Tensor,
    value: Tensor,
    old_log_prob: Tensor,
    old_value: Tensor,
    advantage: Tensor,
    value_target: Tensor,
    clip_coef: float = 0.2,
    value_clip: float | None = 0.2,
    ent_coef: float = 0.01,
    vf_coef: float = 0.5,
    normalize_advantage: bool = True,
) -> PPOLoss:
    """:func:`ppo_loss` for any policy distribution (a Gaussian, say): the new log-probabilities
    and entropies `[M]` come from the caller's distribution, and the rest of the loss is one op.

    `log_prob`, `entropy` and `value` are differentiated (d loss / d entropy is
    `-ent_coef / M`); the other tensors are targets. Arguments and result as :func:`ppo_loss`.
    """
    _tensors(
        log_prob=log_prob,
        entropy=entropy,
        value=value,
        old_log_prob=old_log_prob,
        old_value=old_value,
        advantage=advantage,
        value_target=value_target,
    )
    loss, stats, _, _ = torch.ops.nostall.ppo_loss_from_log_prob.default(
        log_prob,
        entropy,
        value,
        old_log_prob,
        old_value,
        advantage,
        value_target,
        *_ppo_scalars(clip_coef, value_clip, ent_coef, vf_coef, normalize_advantage),
    )
    return PPOLoss(loss, *stats.unbind(), stats)
