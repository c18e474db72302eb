"""What `nostall train` shows and leaves behind: a progress bar, TensorBoard logs, a learning
curve, a timeline of rollout and training overlapping, and a short report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nostall.train.results import TrainResult


@dataclass
class Progress:
    """tqdm bar plus TensorBoard scalars, fed by the trainer's log callback."""

    total_steps: int
    out_dir: Path

    def __post_init__(self):
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        self.bar = tqdm(total=self.total_steps, unit="step", dynamic_ncols=True)
        self.writer = SummaryWriter(str(self.out_dir / "tensorboard"))
        self._last = 0

    def __call__(self, steps: int, metrics: dict[str, float]) -> None:
        self.bar.update(steps - self._last)
        self._last = steps
        postfix = {"steps/s": f"{metrics['steps_per_second']:.0f}"}
        if "episode_return" in metrics:
            postfix["return"] = f"{metrics['episode_return']:.1f}"
        postfix["lag"] = f"{metrics['version_lag']:.0f}"
        self.bar.set_postfix(postfix)
        for name, value in metrics.items():
            self.writer.add_scalar(f"train/{name}", value, steps)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


def figure(size: tuple[float, float]):
    # A bare Figure draws with Agg without pyplot: no backend selection, no global figure
    # registry, and a faster start (the plots are written while the user waits).
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    return fig, fig.subplots()


def plot_learning_curve(result: TrainResult, path: Path, title: str) -> None:
    fig, ax = figure((7, 4))
    if result.curve:
        steps, _, returns = zip(*result.curve, strict=True)
        ax.plot(steps, returns, label="mean return, last 20 episodes")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_timeline(
    result: TrainResult,
    path: Path,
    title: str,
    window_s: float = 2.0,
    rollout_label: str = "rollout",
) -> None:
    """The first `window_s` seconds after warm-up: when each side was busy."""
    spans = result.timeline
    fig, ax = figure((9, 2.6))
    if spans:
        origin = spans[min(len(spans) - 1, 12)][1]  # past warm-up and the watched iterations
        for row, (side, color) in enumerate((("train", "tab:orange"), ("rollout", "tab:blue"))):
            # One collection a side: a bar per span as its own artist took a second to draw.
            bars = [(start - origin, end - start) for s, start, end in spans
                    if s == side and origin <= start <= origin + window_s]  # fmt: skip
            ax.broken_barh(bars, (row - 0.4, 0.8), color=color)
        ax.set_yticks([0, 1], ["trainer", rollout_label])
        ax.set_xlim(0, window_s)
    ax.set_xlabel("seconds")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(result: TrainResult, algo: str) -> dict:
    args = result.args
    rollout = [end - start for side, start, end in result.timeline if side == "rollout"]
    train = [end - start for side, start, end in result.timeline if side == "train"]
    return {
        "algorithm": algo,
        "env_id": args["env_id"],
        "seed": args["seed"],
        "staleness": args["staleness"],
        "env_steps": result.steps,
        "seconds": round(result.seconds, 3),
        "steps_per_second": round(result.steps_per_second, 1),
        "solved_at_steps": result.solved_at[0] if result.solved_at else None,
        "time_to_solve_s": round(result.solved_at[1], 3) if result.solved_at else None,
        "final_return": result.final_return,
        "syncs_per_iteration": result.syncs_per_iteration,
        "sync_sites": result.sync_sites,
        "mean_rollout_ms": round(1e3 * sum(rollout) / len(rollout), 2) if rollout else None,
        "mean_update_ms": round(1e3 * sum(train) / len(train), 2) if train else None,
        "dropped_chunks": result.dropped_chunks,
        "dropped_causes": result.dropped_causes,
    }


def format_report(summary: dict) -> str:
    solved = (
        f"solved (mean return of 20 episodes >= threshold) after {summary['solved_at_steps']} "
        f"steps, {summary['time_to_solve_s']} s"
        if summary["solved_at_steps"] is not None
        else "not solved"
    )
    syncs = summary["syncs_per_iteration"]
    return "\n".join(
        [
            f"nostall train {summary['algorithm']} on {summary['env_id']} "
            f"(seed {summary['seed']}, staleness {summary['staleness']})",
            f"  {summary['env_steps']} env steps in {summary['seconds']} s: "
            f"{summary['steps_per_second']} steps/s",
            f"  {solved}; final mean return {summary['final_return']}",
            f"  rollout {summary['mean_rollout_ms']} ms/chunk, update "
            f"{summary['mean_update_ms']} ms/chunk",
            f"  unintended host-device syncs per iteration (trainer side): "
            f"{'n/a' if syncs is None else f'{syncs:g}'}",
        ]
        + (
            [
                f"  chunks dropped with a lost worker: {summary['dropped_chunks']} "
                f"({'; '.join(summary['dropped_causes'])})"
            ]
            if summary.get("dropped_chunks")
            else []
        )
    )


def write_outputs(result: TrainResult, algo: str, out_dir: Path) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = report(result, algo)
    title = f"{algo} on {summary['env_id']}"
    plot_learning_curve(result, out_dir / "learning_curve.png", title)
    plot_timeline(result, out_dir / "timeline.png", f"{title}: rollout and training over time")
    if result.policy is not None:
        from nostall.policy import save_policy

        save_policy(result.policy, out_dir / "policy.pt")
    (out_dir / "report.json").write_text(json.dumps(summary, indent=2))
    text = format_report(summary)
    (out_dir / "report.txt").write_text(text + "\n")
    return text
