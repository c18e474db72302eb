"""TRL's per-batch figures of a generation batch, computed on the host from what the rewards
already read (no device access): the reward's spread within groups, each reward function's
mean and spread, and the completions' lengths and how many max_new_tokens cut off. The names
are TRL's, so a TensorBoard view reads the same."""

from __future__ import annotations

import math
import statistics


def _std(values: list[float]) -> float:
    """The unbiased standard deviation (torch.std's default, as TRL takes it); 0 for one value."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def batch_stats(
    rewards: list[float],
    per_function: dict[str, list[float]],
    lengths: list[int],
    ended: list[bool],
    group_size: int,
) -> dict[str, float]:
    """`rewards`: each completion's weighted total; `per_function`: each reward function's raw
    values (NaN where it returned None); `lengths`: completion tokens, <eos> included; `ended`:
    whether a completion ended with <eos>."""
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    spreads = [_std(group) for group in groups]
    stats = {
        "reward_std": sum(spreads) / len(spreads),
        "frac_reward_zero_std": sum(s == 0.0 for s in spreads) / len(spreads),
    }
    for name, values in per_function.items():
        applied = [v for v in values if not math.isnan(v)]  # (TRL's nanmean / nanstd)
        stats[f"rewards/{name}/mean"] = sum(applied) / len(applied) if applied else math.nan
        stats[f"rewards/{name}/std"] = _std(applied) if applied else math.nan
    terminated = [n for n, end in zip(lengths, ended, strict=True) if end]
    stats.update(
        {
            "completions/mean_length": sum(lengths) / len(lengths),
            "completions/min_length": float(min(lengths)),
            "completions/max_length": float(max(lengths)),
            "completions/clipped_ratio": 1.0 - len(terminated) / len(lengths),
            "completions/mean_terminated_length": sum(terminated) / len(terminated)
            if terminated
            else 0.0,
            "completions/min_terminated_length": float(min(terminated, default=0)),
            "completions/max_terminated_length": float(max(terminated, default=0)),
        }
    )
    return stats
