"""How much of one side's time another side was busy through, in time that grows with the
number of spans as n log n (not n x m), and, while a run goes, in memory that does not grow
with it.

The figure is |S ∩ U(O)| / |S|: the side's spans S (each counted, even where two overlap)
against the union U(O) of the other side's. With the union merged and its lengths summed in
order, the measure of U(O) up to a time x is a binary search, so each of the side's spans
costs log m."""

from __future__ import annotations

from bisect import bisect_right

Span = tuple[float, float, bool]  # (start, end, whether it is the measured side's)


def overlap_fraction(spans, side: str, other: str) -> float | None:
    """The part of `side`'s time during which `other` was busy too (its spans' union); None
    without any of `side`'s time. `spans`: (side, start, end) tuples."""
    marked = [(start, end, name == side) for name, start, end in spans if name in (side, other)]
    total, shared = measure(marked, float("-inf"), float("inf"))
    return shared / total if total > 0 else None


def measure(spans: list[Span], lo: float, hi: float) -> tuple[float, float]:
    """(the side's time, the part of it the other side was busy through), both within
    [lo, hi]."""
    busy = union([(max(s, lo), min(e, hi)) for s, e, mine in spans if not mine])
    starts = [s for s, _ in busy]
    before = [0.0]  # before[i]: the busy time of the intervals before the i-th
    for s, e in busy:
        before.append(before[-1] + e - s)

    def busy_until(x: float) -> float:
        i = bisect_right(starts, x) - 1
        if i < 0:
            return 0.0
        s, e = busy[i]
        return before[i] + min(x, e) - s

    total = shared = 0.0
    for s, e, mine in spans:
        a, b = max(s, lo), min(e, hi)
        if mine and b > a:
            total += b - a
            shared += busy_until(b) - busy_until(a)
    return total, shared


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time (empty ones dropped)."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class OverlapMeter:
    """overlap_fraction over a run, as its spans arrive: the time before a cut is folded into
    two running sums once no span still to come can reach back to it, so what is kept is the
    spans of the last `horizon` seconds, whatever the run's length.

    A span is recorded when its side hands it over, which can be after later spans of the other
    side (a chunk waits in the queue through an update) but never by more than a few spans. The
    horizon is 8 times the longest span seen, and at least `min_horizon_s`. A span that still
    reaches back before the cut (longer than that) counts from the cut on, and the time cut off
    is kept in `late_s`, which the report gives."""

    def __init__(self, side: str, other: str, fold_at: int = 2048, min_horizon_s: float = 2.0):
        self.side, self.other = side, other
        self.base_fold_at = self.fold_at = fold_at
        self.min_horizon_s = min_horizon_s
        self.pending: list[Span] = []
        self.cut = float("-inf")  # time before this is in the sums
        self.total = self.shared = 0.0  # the sums, up to the cut
        self.latest_end = float("-inf")
        self.longest = 0.0
        self.late_s = 0.0
        self.work = 0  # spans measured, over every fold: what the figure cost, for the tests

    def add(self, name: str, start: float, end: float) -> None:
        if name not in (self.side, self.other) or end <= start:
            return
        self.longest = max(self.longest, end - start)
        self.latest_end = max(self.latest_end, end)
        if start < self.cut:
            self.late_s += min(end, self.cut) - start
            start = self.cut
            if end <= start:
                return
        self.pending.append((start, end, name == self.side))
        if len(self.pending) >= self.fold_at:
            self._fold()

    def _fold(self) -> None:
        cut = self.latest_end - max(self.min_horizon_s, 8.0 * self.longest)
        if cut > self.cut:
            total, shared = measure(self.pending, self.cut, cut)
            self.work += len(self.pending)
            self.total += total
            self.shared += shared
            self.pending = [(max(s, cut), e, mine) for s, e, mine in self.pending if e > cut]
            self.cut = cut
        # Amortised: the next fold waits until the kept spans have doubled.
        self.fold_at = max(self.base_fold_at, 2 * len(self.pending))

    def fraction(self) -> float | None:
        total, shared = measure(self.pending, self.cut, float("inf"))
        self.work += len(self.pending)
        total += self.total
        shared += self.shared
        return shared / total if total > 0 else None
