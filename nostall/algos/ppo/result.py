"""What a PPO / APPO run returns beyond every trainer's figures: its episode-return curve,
throughput in environment steps, when it was solved, and the trained policy (policy.pt)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nostall.train.result import Curve, TrainResult, rounded


@dataclass
class PPOResult(TrainResult):
    algorithm: str = "ppo"
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (step, s, return)
    steps: int = 0
    solved_at: tuple[int, float] | None = None  # (env steps, seconds) when first solved
    final_return: float | None = None
    first_iteration_at: tuple[int, float] | None = None  # (env steps, seconds) after iteration 1
    resumed_at_steps: int = 0  # env steps already done by the run this one resumed
    policy: dict | None = None  # the final policy (nostall.algos.ppo.policy.policy_record)

    @property
    def steps_per_second(self) -> float:
        """Over this process's run, start-up included (a resumed run's earlier steps are not
        counted: they took no time here)."""
        return (self.steps - self.resumed_at_steps) / self.seconds if self.seconds else 0.0

    @property
    def steady_steps_per_second(self) -> float:
        """After the first iteration: the throughput without start-up (a rollout process's
        spawn, first-call warm-up)."""
        if self.first_iteration_at is None or self.seconds <= self.first_iteration_at[1]:
            return 0.0
        steps, seconds = self.first_iteration_at
        return (self.steps - steps) / (self.seconds - seconds)

    def summary(self) -> dict:
        return {
            **super().summary(),
            "env_id": self.args["env_id"],
            "env_steps": self.steps,
            "steps_per_second": round(self.steps_per_second, 1),
            "solved_at_steps": self.solved_at[0] if self.solved_at else None,
            "time_to_solve_s": round(self.solved_at[1], 3) if self.solved_at else None,
            "final_return": self.final_return,
            "mean_rollout_ms": rounded(self.side_ms("rollout"), 2),
            "mean_update_ms": rounded(self.side_ms("train"), 2),
        }

    def summary_lines(self, summary: dict) -> list[str]:
        solved = (
            f"solved (mean return of 20 episodes >= threshold) after "
            f"{summary['solved_at_steps']} steps, {summary['time_to_solve_s']} s"
            if summary["solved_at_steps"] is not None
            else "not solved"
        )
        syncs = summary["syncs_per_update"]
        return [
            f"nostall train {summary['algorithm']} on {summary['env_id']} "
            f"(seed {summary['seed']}, staleness {summary['staleness']})",
            f"  {summary['env_steps']} env steps in {summary['seconds']} s: "
            f"{summary['steps_per_second']} steps/s",
            f"  {solved}; final mean return {summary['final_return']}",
            f"  rollout {summary['mean_rollout_ms']} ms/chunk, update "
            f"{summary['mean_update_ms']} ms/chunk",
            f"  unintended host-device syncs per update (trainer side): "
            f"{'n/a' if syncs is None else f'{syncs:g}'}",
            *super().summary_lines(summary),
        ]

    def learning_curve(self) -> Curve:
        steps = [float(p[0]) for p in self.curve]
        returns = [p[2] for p in self.curve]
        return Curve(
            steps, returns, "environment steps", "episode return", "mean return, last 20 episodes"
        )
