"""What a training run returns, for every algorithm: the figures the shared loop measures, and
each algorithm's own (PPOResult's episode curve, GRPOResult's rewards and tokens) in a subclass.
The report writer (outputs.py) reads a result through `summary()` and `curve()` alone, so it
needs no algorithm."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from nostall.runtime.timeline import Timeline


@dataclass
class Curve:
    """The learning curve a report plots: y against x, and where the target lies."""

    x: list[float]
    y: list[float]
    xlabel: str
    ylabel: str
    label: str
    target: float | None = None
    smooth: int = 0  # also plot the running mean over this many points (0: none)


@dataclass
class TrainResult:
    # What the rollout side is called in plots, and how much of the timeline they show.
    rollout_label: ClassVar[str] = "rollout"
    timeline_window_s: ClassVar[float] = 2.0

    algorithm: str = ""
    args: dict = field(default_factory=dict)  # the config's fields
    seconds: float = 0.0  # the run's wall time (a resumed run's own, not the earlier part's)
    syncs_per_update: float | None = None  # unintended trainer-side syncs, watched updates
    sync_sites: list[str] = field(default_factory=list)
    # When each side worked: running figures over the run and its first spans, for the plot
    # (a list of (side, start, end) spans is taken too, and made one).
    timeline: Timeline = field(default_factory=Timeline)
    metrics: dict[str, float] = field(default_factory=dict)  # the last logged values
    dropped_chunks: int = 0  # chunks lost with a rollout worker (Ray), never trained on
    dropped_causes: list[str] = field(default_factory=list)
    worker_restarts: list[str] = field(default_factory=list)  # how each restarted worker went on
    # Peak memory in MiB: "host" (this process's resident set), "device" (on a GPU).
    peak_memory_mib: dict[str, float] = field(default_factory=dict)
    # The checkpoints this run's lineage wrote (a resumed run's earlier ones first), oldest
    # first: the only files save_total_limit may delete.
    checkpoints: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.timeline, Timeline):
            self.timeline = Timeline.of(self.timeline)

    def side_ms(self, side: str) -> float | None:
        """The mean span of one side's work ("rollout" or "train") in milliseconds."""
        return self.timeline.mean_ms(side)

    @property
    def update_overlap(self) -> float | None:
        """The part of the updates' time during which the rollout side worked too: what
        staleness >= 1 buys (near 0 where the two take turns: only the publish and a checkpoint
        after an update overlap the next chunk's start)."""
        return self.timeline.overlap("train", "rollout")

    def summary(self) -> dict:
        """report.json: the figures every algorithm reports; subclasses add their own."""
        overlap = self.update_overlap
        return {
            "algorithm": self.algorithm,
            "seed": self.args.get("seed"),
            "staleness": self.args.get("staleness"),
            "backend": self.args.get("backend", "thread"),
            "seconds": round(self.seconds, 3),
            "syncs_per_update": self.syncs_per_update,
            "sync_sites": self.sync_sites,
            "dropped_chunks": self.dropped_chunks,
            "dropped_causes": self.dropped_causes,
            "worker_restarts": self.worker_restarts,
            "peak_memory_mib": dict(self.peak_memory_mib),
            "update_overlap": None if overlap is None else round(overlap, 3),
            # Time of spans too long for the overlap's folding, left out of it (0 in practice).
            "timeline_late_s": round(self.timeline.late_s, 3),
        }

    def summary_lines(self, summary: dict) -> list[str]:
        """report.txt's lines after the algorithm's own."""
        lines = []
        overlap = summary.get("update_overlap")
        if overlap is not None:
            share = f"{100 * overlap:.0f}%"
            lines.append(f"  {self.rollout_label} ran during {share} of the updates' time")
        if summary.get("timeline_late_s"):
            lines.append(
                f"  {summary['timeline_late_s']} s of spans began too far back to be "
                f"counted in the overlap"
            )
        peak = summary.get("peak_memory_mib") or {}
        if peak:
            lines.append("  peak memory: " + ", ".join(f"{k} {v} MiB" for k, v in peak.items()))
        if summary.get("dropped_chunks"):
            lines.append(
                f"  chunks dropped with a lost worker: {summary['dropped_chunks']} "
                f"({'; '.join(summary['dropped_causes'])})"
            )
        for restart in summary.get("worker_restarts") or []:
            lines.append(f"  {restart}")
        return lines

    def learning_curve(self) -> Curve:
        raise NotImplementedError


def rounded(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)
