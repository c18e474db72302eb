"""The run's timeline: when each side worked ((side, start, end) spans: "rollout", "train",
vLLM's weight "push"), what the overlap plot draws, and how much of one side's time another
side was busy through, the figure that says whether staleness >= 1 bought any overlap.

A run of 200,000 steps records 400,000 spans, so nothing here keeps them all or walks them
all at the end: each side's count and time are running sums, the overlaps are folded into
running sums as the run goes (overlap.py), and only the first spans are kept, for the plot
(it draws a window of a few spans after warm-up)."""

from __future__ import annotations

import time

from nostall.runtime.overlap import OverlapMeter, overlap_fraction

__all__ = ["Timeline", "overlap_fraction"]

# The (side, other) pairs a report gives the overlap of: the rollout side's work during the
# updates, and vLLM's weight pushes during an update.
PAIRS = (("train", "rollout"), ("push", "train"))
# Spans kept for timeline.png, from the first recorded: its window opens at the 12th and shows
# about four of the slower side's spans.
KEPT_SPANS = 4096


class Timeline:
    """(side, start, end) intervals, in seconds from this timeline's origin: running figures
    over every span, and the first `kept` spans for the overlap plot."""

    def __init__(self, kept: int | None = None):
        self.origin = time.perf_counter()
        self.kept = KEPT_SPANS if kept is None else kept
        self.spans: list[tuple[str, float, float]] = []  # the first `kept` spans
        self.recorded = 0  # spans recorded, kept or not
        self._time: dict[str, list[float]] = {}  # side -> [count, seconds]
        self._meters = {pair: OverlapMeter(*pair) for pair in PAIRS}

    @classmethod
    def of(cls, spans, kept: int | None = None) -> Timeline:
        """A timeline holding these (side, start, end) spans, with its origin at 0."""
        timeline = cls(kept)
        timeline.origin = 0.0
        for side, start, end in spans:
            timeline.record(side, start, end)
        return timeline

    def record(self, side: str, start: float, end: float) -> None:
        self._add(side, start - self.origin, end - self.origin)

    def record_wall(self, side: str, start: float, end: float) -> None:
        """A span timed by the wall clock (`time.time()`: another process's, which shares the
        wall clock but not `perf_counter`'s origin); one begun before this timeline (a chunk
        restored from a checkpoint, timed by an earlier run) is left out."""
        offset = time.time() - time.perf_counter() + self.origin
        if start - offset >= 0:
            self._add(side, start - offset, end - offset)

    def _add(self, side: str, start: float, end: float) -> None:
        self.recorded += 1
        if len(self.spans) < self.kept:
            self.spans.append((side, start, end))
        totals = self._time.setdefault(side, [0, 0.0])
        totals[0] += 1
        totals[1] += end - start
        for meter in self._meters.values():
            meter.add(side, start, end)

    def count(self, side: str) -> int:
        return self._time.get(side, (0, 0.0))[0]

    def total_s(self, side: str) -> float:
        """One side's seconds of work over the whole run."""
        return self._time.get(side, (0, 0.0))[1]

    def mean_ms(self, side: str) -> float | None:
        """The mean span of one side's work in milliseconds, over the whole run."""
        count, seconds = self._time.get(side, (0, 0.0))
        return 1e3 * seconds / count if count else None

    def overlap(self, side: str, other: str) -> float | None:
        """The part of `side`'s time during which `other` was busy too, over the whole run;
        None without any of `side`'s time."""
        meter = self._meters.get((side, other))
        if meter is None:
            raise KeyError(f"the timeline measures the overlaps of {PAIRS}, not {(side, other)}")
        return meter.fraction()

    @property
    def late_s(self) -> float:
        """Seconds of spans that began before the part of the run already folded into the
        overlaps' sums (a span longer than the folding horizon): left out of the overlaps, and
        reported, so that the figure is never silently off. 0 in every run seen so far."""
        return sum(meter.late_s for meter in self._meters.values())
