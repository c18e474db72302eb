"""A turn's sampling noise: each episode's turn draws from a stream of its own, seeded by (the
batch's seed, the episode, the position the turn starts at), so a turn samples the same tokens
whatever else is decoded beside it."""

from __future__ import annotations

import torch


class TurnNoise:
    """A round's sampling noise: each row's from a stream of its own, seeded by (the batch's
    seed, its episode, the position its turn starts at), so a turn draws the same tokens
    whatever round it joins. Drawn on the host (a CPU generator's draws are a prefix whatever
    their count: token by token or all at once, the same numbers)."""

    def __init__(self, seeds: list[int], vocab: int, device: torch.device):
        self.vocab, self.device = vocab, device
        self.seeds = list(seeds)  # (an engine with a sampler of its own seeds it with them)
        self.streams = [torch.Generator().manual_seed(s) for s in seeds]

    def block(self, steps: int) -> torch.Tensor:
        """[steps, rows, vocab]: every token's noise at once."""
        rows = [torch.rand((steps, self.vocab), generator=g) for g in self.streams]
        return torch.stack(rows, 1).to(self.device)

    def __call__(self, t: int) -> torch.Tensor:
        """[rows, vocab]: the next token's (t = 0, 1, ... in order)."""
        rows = [torch.rand(self.vocab, generator=g) for g in self.streams]
        return torch.stack(rows).to(self.device)


def turn_seed(noise_seed: int, key: int, start: int) -> int:
    """The seed of a turn's noise stream: the batch's seed, the episode, where the turn starts."""
    return hash((noise_seed, key, start)) & ((1 << 62) - 1)
