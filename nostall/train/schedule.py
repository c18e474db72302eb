"""The learning rate at each step, for every algorithm: transformers' schedules with warm-up
("constant", "linear", "cosine"), which PPO's `anneal_lr` is the linear one of, without warm-up."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def learning_rate_at(
    base: float, step: int, total: int, kind: str = "constant", warmup: int = 0
) -> float:
    """The learning rate of `step` (1-based) of `total`: `warmup` steps rising from 0, then
    `kind` from `base` (linear and cosine decay to 0 at the end of the run)."""
    done = step - 1
    if done < warmup:
        return base * done / warmup
    if kind == "constant":
        return base
    progress = (done - warmup) / max(1, total - warmup)
    if kind == "linear":
        return base * max(0.0, 1.0 - progress)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
