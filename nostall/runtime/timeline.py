"""The run's timeline: when each side worked ((side, start, end) spans: "rollout", "train",
vLLM's weight "push"), what the overlap plot draws, and how much of one side's time another
side was busy through, the figure that says whether staleness >= 1 bought any overlap."""

from __future__ import annotations

import time


class Timeline:
    """(side, start, end) intervals, for the overlap plot."""

    def __init__(self):
        self.origin = time.perf_counter()
        self.spans: list[tuple[str, float, float]] = []

    def record(self, side: str, start: float, end: float) -> None:
        self.spans.append((side, start - self.origin, end - self.origin))

    def record_wall(self, side: str, start: float, end: float) -> None:
        """A span timed by the wall clock (`time.time()`: another process's, which shares the
        wall clock but not `perf_counter`'s origin); one begun before this timeline (a chunk
        restored from a checkpoint, timed by an earlier run) is left out."""
        offset = time.time() - time.perf_counter() + self.origin
        if start - offset >= 0:
            self.spans.append((side, start - offset, end - offset))


def overlap_fraction(spans: list[tuple[str, float, float]], side: str, other: str) -> float | None:
    """The part of `side`'s time during which `other` was busy too (its spans' union); None
    without any of `side`'s time."""
    busy = _union([(s, e) for name, s, e in spans if name == other])
    total = shared = 0.0
    for name, start, end in spans:
        if name != side:
            continue
        total += end - start
        for s, e in busy:
            shared += max(0.0, min(end, e) - max(start, s))
    return shared / total if total > 0 else None


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
