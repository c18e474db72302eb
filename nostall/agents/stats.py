"""Where a batch of episodes' generation time went, and its spans for the run's timeline."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoundStats:
    """Where a batch's generation time went: decoding, and waiting with no episode ready; and
    its spans for the run's timeline, by the wall clock: ("decode", start, end) a round (a
    continuous batch: a stretch of steps with some episode decoding), ("tool", ...) an
    environment call, ("idle", ...) a wait with no episode ready."""

    decode_s: float = 0.0
    wait_s: float = 0.0
    rounds: int = 0  # decode rounds (a continuous batch: its steps)
    env_calls: int = 0  # resets and steps answered (or given up)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    # With in-flight weight swaps: the policy version of each token sampled (in the order they
    # were sampled), and the swaps taken; empty and 0 without.
    token_versions: list[int] = field(default_factory=list)
    swaps: int = 0
