"""What a GRPO run returns beyond every trainer's figures: each step's mean reward and time,
completion tokens, when the target reward was reached, and the generation side's figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from nostall.train.result import Curve, TrainResult, rounded


@dataclass
class GRPOResult(TrainResult):
    rollout_label: ClassVar[str] = "generation"
    timeline_window_s: ClassVar[float] = 1.0

    algorithm: str = "grpo"
    rewards: list[float] = field(default_factory=list)  # mean reward of each step's batch
    step_times: list[float] = field(default_factory=list)  # seconds from start, at each step
    tokens: int = 0  # completion tokens trained on
    steps_to_target: int | None = None
    time_to_target_s: float | None = None
    generation_ms: float | None = None  # mean per batch (the rollout side)
    update_ms: float | None = None  # mean per step (the trainer side)
    syncs_per_decode_step: float | None = None
    mean_lag: float | None = None  # versions between a batch's start and the trainer's
    mean_token_lag: float | None = None  # the same per token (differs with in-flight swaps)
    weight_swaps: int = 0  # in-flight weight swaps the generator made
    weight_pushes: int = 0  # weights pushed into a vLLM engine (--generator vllm)
    weight_push_ms: float | None = None  # the time of one push, on average
    reward_functions: list[str] = field(default_factory=list)
    dataset: str = ""  # what the prompts came from
    compute_dtype: str = "float32"  # the update's and generation's arithmetic (--dtype)
    master_dtype: str = "float32"  # the weights the optimizer steps (--master-dtype)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def weight_push_overlap(self) -> float | None:
        """The part of the vLLM weight pushes' time during which the trainer was updating
        (None: no push timed)."""
        return self.timeline.overlap("push", "train")

    def note_target(self, target: float, window: int = 10) -> None:
        """Sets steps_to_target / time_to_target_s at the first step whose mean reward over
        the last `window` steps reaches `target`."""
        if self.steps_to_target is not None or len(self.rewards) < window:
            return
        if sum(self.rewards[-window:]) / window >= target:
            self.steps_to_target = len(self.rewards)
            self.time_to_target_s = self.step_times[-1]

    def find_target(self, target: float, window: int = 10) -> None:
        """steps_to_target / time_to_target_s over the rewards so far (a resumed run's, from
        its checkpoint: the first crossing, not the first step after the resume)."""
        rewards, times = self.rewards, self.step_times
        self.steps_to_target = self.time_to_target_s = None
        for end in range(window, len(rewards) + 1):
            if sum(rewards[end - window : end]) / window >= target:
                self.steps_to_target, self.time_to_target_s = end, times[end - 1]
                return

    def episode_timing(self) -> dict | None:
        """Multi-turn episodes' time over the run (None: no episodes): decode rounds and
        environment calls (count, mean ms), and the decoder's idle share of generation (its
        waits with no episode ready, over those and the decode rounds)."""
        timeline = self.timeline
        rounds = timeline.count("decode")
        if not rounds:
            return None
        decode_s, idle_s = timeline.total_s("decode"), timeline.total_s("idle")
        return {
            "decode_rounds": rounds,
            "decode_round_ms": rounded(timeline.mean_ms("decode")),
            "tool_calls": timeline.count("tool"),
            "tool_call_ms": rounded(timeline.mean_ms("tool")),
            "decoder_idle_fraction": round(idle_s / (idle_s + decode_s), 4),
        }

    def summary(self) -> dict:
        args = self.args
        recent = self.rewards[-10:]
        return {
            **super().summary(),
            "model": args["model"],
            "task": args["dataset"] or args["task"],
            "dataset": self.dataset,
            "reward_functions": list(self.reward_functions),
            "learning_rate": args["learning_rate"],
            "loss_type": args["loss_type"],
            "compute_dtype": self.compute_dtype,
            "master_dtype": self.master_dtype,
            "steps": len(self.rewards),
            "target_reward": args["target_reward"],
            "steps_to_target": self.steps_to_target,
            "time_to_target_s": rounded(self.time_to_target_s),
            "final_reward": round(sum(recent) / len(recent), 4) if recent else None,
            "tokens_per_second": round(self.tokens_per_second, 1),
            "generation_ms_per_step": rounded(self.generation_ms),
            "update_ms_per_step": rounded(self.update_ms),
            "syncs_per_decode_step": self.syncs_per_decode_step,
            "mean_version_lag": rounded(self.mean_lag),
            "mean_token_version_lag": rounded(self.mean_token_lag),
            "inflight_weights": args.get("inflight_weights", False),
            "weight_swaps": self.weight_swaps,
            "generator": args.get("generator", "native"),
            "weight_pushes": self.weight_pushes,
            "weight_push_ms": rounded(self.weight_push_ms),
            "weight_push_overlap": rounded(self.weight_push_overlap),
            "trainers": args.get("trainers", 1),
            "episodes": self.episode_timing(),
            # TRL's figures too (reward_std, completions/...); NaN (no value) as null.
            "last_logged": {k: None if v != v else v for k, v in self.metrics.items()},
        }

    def summary_lines(self, summary: dict) -> list[str]:
        if summary["steps_to_target"] is not None:
            reached = (
                f"reached mean reward {summary['target_reward']} (last 10 steps) at "
                f"step {summary['steps_to_target']}, "
                f"{summary['time_to_target_s']} s"
            )
        else:
            reached = f"did not reach mean reward {summary['target_reward']}"
        inflight = ""
        if summary["inflight_weights"]:
            inflight = (
                f" ({summary['mean_token_version_lag']} per token, "
                f"{summary['weight_swaps']} in-flight weight swaps)"
            )
        generator = ""
        if summary["generator"] == "vllm":
            pushes = f"{summary['weight_pushes']} weight pushes, {summary['weight_push_ms']} ms"
            generator = f", vLLM generating ({pushes} each{_push_overlap(summary)})"
        return [
            f"nostall train grpo: {summary['model']} on {summary['task']} (seed "
            f"{summary['seed']}, staleness {summary['staleness']}, loss {summary['loss_type']}, "
            f"generation on a {summary['backend']}{generator})",
            f"  {summary['steps']} steps in {summary['seconds']} s: "
            f"{summary['tokens_per_second']} completion tokens/s",
            f"  prompts from {summary['dataset']}; rewards {', '.join(summary['reward_functions'])}"
            f"; learning rate {summary['learning_rate']}",
            f"  {reached}; final reward {summary['final_reward']}",
            f"  generation {summary['generation_ms_per_step']} ms/step, update "
            f"{summary['update_ms_per_step']} ms/step{_ranks(summary)}, mean version lag "
            f"{summary['mean_version_lag']}{inflight}",
            f"  unintended host-device syncs: {summary['syncs_per_update']} per update, "
            f"{summary['syncs_per_decode_step']} per decode step",
            *_episode_lines(summary),
            f"  compute {summary['compute_dtype']} (master weights {summary['master_dtype']}); "
            f"behaviour "
            f"log-probs within {_logp_gap(summary)} of the trainer's (last logged)",
            *super().summary_lines(summary),
        ]

    def learning_curve(self) -> Curve:
        steps = [float(i) for i in range(1, len(self.rewards) + 1)]
        return Curve(
            steps,
            list(self.rewards),
            "step (generation batch)",
            "reward",
            "batch mean reward",
            target=self.args["target_reward"],
            smooth=10,
        )


def _episode_lines(summary: dict) -> list[str]:
    timing = summary.get("episodes")
    if not timing:
        return []
    return [
        f"  episodes: {timing['decode_rounds']} decode rounds ({timing['decode_round_ms']} ms "
        f"each), {timing['tool_calls']} environment calls ({timing['tool_call_ms']} ms each), "
        f"the decoder idle {100 * timing['decoder_idle_fraction']:.1f}% of generation"
    ]


def _ranks(summary: dict) -> str:
    trainers = summary.get("trainers", 1)
    return f" on {trainers} FSDP2 ranks" if trainers > 1 else ""


def _push_overlap(summary: dict) -> str:
    overlap = summary.get("weight_push_overlap")
    return "" if overlap is None else f", {100 * overlap:.0f}% of that during an update"


def _logp_gap(summary: dict) -> str:
    gap = summary["last_logged"].get("sampling/sampling_logp_difference/max")
    return "?" if gap is None else f"{gap:.2g}"
