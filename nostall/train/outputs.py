"""What a training run shows and leaves behind, for every algorithm: a progress bar and
TensorBoard scalars while it runs; a learning curve, a timeline of the rollout side and the
trainer overlapping, and a short report (report.txt, report.json) when it ends. The result
says what to plot and report (nostall.train.result), so nothing here knows an algorithm."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from nostall import files
from nostall.train.result import TrainResult

# The figures the bar shows, when a log line has them.
BAR_FIGURES = {
    "steps_per_second": ("steps/s", "{:.0f}"),
    "episode_return": ("return", "{:.1f}"),
    "reward": ("reward", "{:.3f}"),
    "tokens_per_second": ("tok_s", "{:.0f}"),
    "version_lag": ("lag", "{:.0f}"),
}


class Progress:
    """TensorBoard scalars and, unless `bar` is False, a tqdm bar, fed by the trainer's log
    callback (progress in the algorithm's unit: environment steps, or generation batches).
    Each run writes its own folder under out_dir/tensorboard/ (its start time and process), so
    two runs into one output folder stay two runs in TensorBoard."""

    def __init__(
        self,
        total: int,
        out_dir: Path,
        unit: str = "step",
        first: int = 0,
        bar: bool = True,
        tensorboard: bool = True,
    ):
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=first, unit=unit, dynamic_ncols=True) if bar else None
        run = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.log_dir = Path(out_dir) / "tensorboard" / run
        self.writer = SummaryWriter(str(self.log_dir)) if tensorboard else None
        self._last = first

    def __call__(self, progress: int, metrics: dict[str, float]) -> None:
        if self.bar is not None:
            self.bar.update(progress - self._last)
            shown = {key: figure for key, figure in BAR_FIGURES.items() if key in metrics}
            self.bar.set_postfix(
                {name: form.format(metrics[key]) for key, (name, form) in shown.items()}
            )
        self._last = progress
        if self.writer is not None:
            for name, value in metrics.items():
                self.writer.add_scalar(f"train/{name}", value, progress)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


def figure(size: tuple[float, float]):
    # A bare Figure draws with Agg without pyplot: no backend selection, no global figure
    # registry, and a faster start (the plots are written while the user waits).
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    return fig, fig.subplots()


def plot_learning_curve(result: TrainResult, path: Path, title: str) -> None:
    curve = result.learning_curve()
    fig, ax = figure((7, 4))
    if curve.x:
        x, y = downsampled(curve.x, curve.y)
        ax.plot(x, y, alpha=0.3 if curve.smooth else 1.0, label=curve.label)
        if curve.smooth:
            n = curve.smooth
            ax.plot(*downsampled(curve.x, running_mean(curve.y, n)), label=f"mean of the last {n}")
        if curve.target is not None:
            ax.axhline(curve.target, color="gray", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel(curve.xlabel)
    ax.set_ylabel(curve.ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    with files.replaced(path) as f:
        fig.savefig(f, dpi=120, format="png")


# Points a curve is drawn with at most: a 200,000-step run's per-step rewards drawn as they are
# take seconds and look no different at the figure's width.
CURVE_POINTS = 2000


def running_mean(y: list[float], n: int) -> list[float]:
    """The mean of each point and the n - 1 before it (fewer at the start), in one pass."""
    sums = [0.0]
    for value in y:
        sums.append(sums[-1] + value)
    return [(sums[i + 1] - sums[max(0, i - n + 1)]) / min(n, i + 1) for i in range(len(y))]


def downsampled(x: list[float], y: list[float], points: int = CURVE_POINTS):
    """At most `points` points: consecutive runs of equal length averaged (x and y alike)."""
    if len(x) <= points:
        return list(x), list(y)
    size = -(-len(x) // points)
    runs = range(0, len(x), size)
    return (
        [sum(x[i : i + size]) / len(x[i : i + size]) for i in runs],
        [sum(y[i : i + size]) / len(y[i : i + size]) for i in runs],
    )


# Multi-turn episodes' lanes: (side, color, label).
EPISODE_LANES = [
    ("decode", "tab:purple", "decode rounds"),
    ("tool", "tab:gray", "tool calls"),
    ("idle", "tab:red", "decoder idle"),
]


def plot_timeline(
    result: TrainResult,
    path: Path,
    title: str,
    window_s: float = 2.0,
    rollout_label: str = "rollout",
) -> None:
    """`window_s` seconds after warm-up (the 12th span on): when each side was busy; with
    multi-turn episodes, the generation side's decode rounds, environment calls and the
    decoder's idle waits in lanes of their own."""
    spans = result.timeline.spans  # the run's first spans: the window lies among them
    lanes = [("train", "tab:orange", "trainer"), ("rollout", "tab:blue", rollout_label)]
    lanes += [lane for lane in EPISODE_LANES if any(s == lane[0] for s, _, _ in spans)]
    fig, ax = figure((9, 2.6 + 0.5 * (len(lanes) - 2)))
    if spans:
        # Past warm-up and the watched steps: the 12th span of the two sides' work
        work = [span for span in spans if span[0] in ("train", "rollout")] or spans
        origin = work[min(len(work) - 1, 12)][1]
        for row, (side, color, _) in enumerate(lanes):
            # One collection a side: a bar per span as its own artist took a second to draw.
            bars = [
                (start - origin, end - start)
                for s, start, end in spans
                if s == side and origin <= start <= origin + window_s
            ]
            ax.broken_barh(bars, (row - 0.4, 0.8), color=color)
        # Weight pushes into a generation engine, inside the rollout side's spans.
        pushes = [
            (start - origin, end - start)
            for s, start, end in spans
            if s == "push" and origin <= start <= origin + window_s
        ]
        if pushes:
            ax.broken_barh(pushes, (0.6, 0.8), color="tab:green", label="weight push")
            ax.legend(loc="upper right", fontsize="small")
        ax.set_yticks(range(len(lanes)), [label for _, _, label in lanes])
        ax.set_xlim(0, window_s)
    ax.set_xlabel(f"seconds after the first 12 spans of work (a {window_s:g} s window)")
    ax.set_title(title)
    fig.tight_layout()
    with files.replaced(path) as f:
        fig.savefig(f, dpi=120, format="png")


# What a finished (or interrupted) run leaves in its output folder: a new run refuses to write
# over them unless told to (`nostall train --overwrite`) or resuming.
RUN_OUTPUTS = ("report.json", "report.txt", "policy.pt", "model")


def previous_run(out_dir) -> list[str]:
    """The outputs of an earlier run in `out_dir` (none: [])."""
    out_dir = Path(out_dir)
    return [name for name in RUN_OUTPUTS if (out_dir / name).exists()]


def write_outputs(result: TrainResult, out_dir: Path, subject: str) -> str:
    """report.json, report.txt, learning_curve.png and timeline.png in out_dir; returns the
    report's text. `subject`: what the run trained on, for the plots' titles."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = result.summary()
    title = f"{result.algorithm} on {subject}"
    plot_learning_curve(result, out_dir / "learning_curve.png", title)
    side = result.rollout_label
    # At least four of the slower side's spans: a real model's step can outlast the default.
    spans = [result.side_ms(s) or 0.0 for s in ("rollout", "train")]
    window_s = max(result.timeline_window_s, 4e-3 * max(spans))
    plot_timeline(
        result,
        out_dir / "timeline.png",
        f"{title}: {side} and training over time",
        window_s=window_s,
        rollout_label=side,
    )
    files.write_text(out_dir / "report.json", json.dumps(summary, indent=2))
    text = "\n".join(result.summary_lines(summary))
    files.write_text(out_dir / "report.txt", text + "\n")
    return text
