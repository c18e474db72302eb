"""Random inputs for the loss-op tests: GRPO batches of unequal groups, logits, and token
log-probabilities with masks."""

import torch


def grouped_rewards(group_sizes, dtype=torch.float64, seed=0):
    """Rewards of completions in groups of the given sizes (shuffled), with their group index."""
    g = torch.Generator().manual_seed(seed)
    index = torch.cat([torch.full((n,), i, dtype=torch.int64) for i, n in enumerate(group_sizes)])
    index = index[torch.randperm(len(index), generator=g)]
    reward = torch.randn(len(index), generator=g, dtype=dtype)
    return reward, index


def logits_batch(B, T, V, dtype=torch.float32, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale).to(dtype)
    tokens = torch.randint(0, V, (B, T), generator=g)
    return logits, tokens


def token_batch(B, T, dtype=torch.float64, seed=0, per_token_advantage=False, spread=0.3):
    """(log_prob, old_log_prob, behavior_log_prob, advantage, mask): ratios spread around 1 so
    that some tokens fall outside any reasonable clip range; every row has a token."""
    g = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    old = log_prob + spread * torch.randn(B, T, generator=g, dtype=dtype)
    behavior = old + 0.2 * torch.randn(B, T, generator=g, dtype=dtype)
    shape = (B, T) if per_token_advantage else (B,)
    advantage = torch.randn(*shape, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return log_prob, old, behavior, advantage, mask
