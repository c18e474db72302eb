"""What `nostall train grpo` shows and leaves behind: a progress bar (reward, tokens/s, version
lag), TensorBoard scalars, a reward curve, a timeline of generation and training overlapping,
a report (report.txt, report.json) and the trained model (save_pretrained)."""

from __future__ import annotations

import json
from pathlib import Path

from nostall.training_output import figure, plot_timeline


class LMProgress:
    """tqdm bar plus TensorBoard scalars, fed by the trainer's log callback."""

    def __init__(self, total_steps: int, out_dir: Path, first_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        self.bar = tqdm(total=total_steps, initial=first_step, unit="step", dynamic_ncols=True)
        self.writer = SummaryWriter(str(out_dir / "tensorboard"))
        self._last = first_step

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        self.bar.update(step - self._last)
        self._last = step
        self.bar.set_postfix(reward=f"{metrics['reward']:.3f}",
                             tok_s=f"{metrics['tokens_per_second']:.0f}",
                             lag=f"{metrics['version_lag']:.0f}")  # fmt: skip
        for name, value in metrics.items():
            self.writer.add_scalar(f"train/{name}", value, step)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


def plot_rewards(result, path: Path, title: str, target: float) -> None:
    fig, ax = figure((7, 4))
    rewards = result.rewards
    if rewards:
        steps = range(1, len(rewards) + 1)
        ax.plot(steps, rewards, alpha=0.3, label="batch mean reward")
        window = [sum(rewards[max(0, i - 9) : i + 1]) / len(rewards[max(0, i - 9) : i + 1])
                  for i in range(len(rewards))]  # fmt: skip
        ax.plot(steps, window, label="mean of the last 10 steps")
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("step (generation batch)")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(result) -> dict:
    args = result.args
    return {
        "algorithm": "grpo",
        "model": args["model"],
        "task": args["dataset"] or args["task"],
        "seed": args["seed"],
        "staleness": args["staleness"],
        "backend": args.get("backend", "thread"),
        "loss_type": args["loss_type"],
        "steps": len(result.rewards),
        "seconds": round(result.seconds, 3),
        "target_reward": args["target_reward"],
        "steps_to_target": result.steps_to_target,
        "time_to_target_s": (
            None if result.time_to_target_s is None else round(result.time_to_target_s, 3)
        ),
        "final_reward": (
            round(sum(result.rewards[-10:]) / len(result.rewards[-10:]), 4)
            if result.rewards
            else None
        ),
        "tokens_per_second": round(result.tokens_per_second, 1),
        "generation_ms_per_step": _round(result.generation_ms),
        "update_ms_per_step": _round(result.update_ms),
        "syncs_per_update": result.syncs_per_update,
        "syncs_per_decode_step": result.syncs_per_decode_step,
        "sync_sites": result.sync_sites,
        "mean_version_lag": _round(result.mean_lag),
        "mean_token_version_lag": _round(result.mean_token_lag),
        "inflight_weights": args.get("inflight_weights", False),
        "weight_swaps": result.weight_swaps,
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def format_report(summary: dict) -> str:
    if summary["steps_to_target"] is not None:
        reached = (f"reached mean reward {summary['target_reward']} (last 10 steps) at step "
                   f"{summary['steps_to_target']}, {summary['time_to_target_s']} s")  # fmt: skip
    else:
        reached = f"did not reach mean reward {summary['target_reward']}"
    return "\n".join([
        f"nostall train grpo: {summary['model']} on {summary['task']} (seed {summary['seed']}, "
        f"staleness {summary['staleness']}, loss {summary['loss_type']}, generation on a "
        f"{summary['backend']})",
        f"  {summary['steps']} steps in {summary['seconds']} s: "
        f"{summary['tokens_per_second']} completion tokens/s",
        f"  {reached}; final reward {summary['final_reward']}",
        f"  generation {summary['generation_ms_per_step']} ms/step, update "
        f"{summary['update_ms_per_step']} ms/step, mean version lag {summary['mean_version_lag']}"
        + (f" ({summary['mean_token_version_lag']} per token, {summary['weight_swaps']} in-flight "
           "weight swaps)" if summary["inflight_weights"] else ""),
        f"  unintended host-device syncs: {summary['syncs_per_update']} per update, "
        f"{summary['syncs_per_decode_step']} per decode step",
    ])  # fmt: skip


def write_outputs(result, out_dir: Path) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = report(result)
    title = f"grpo on {summary['task']} ({summary['model']})"
    plot_rewards(result, out_dir / "reward_curve.png", title, summary["target_reward"])
    plot_timeline(result, out_dir / "timeline.png", f"{title}: generation and training",
                  window_s=1.0, rollout_label="generation")  # fmt: skip
    (out_dir / "report.json").write_text(json.dumps(summary, indent=2))
    text = format_report(summary)
    (out_dir / "report.txt").write_text(text + "\n")
    return text
