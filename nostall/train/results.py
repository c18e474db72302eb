"""What a PPO / APPO run returns: its curve, throughput, solve time and sync count (read by the
command's report and plots, which need not import the algorithm)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainResult:
    args: dict
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (step, time, return)
    steps: int = 0
    seconds: float = 0.0
    solved_at: tuple[int, float] | None = None  # (env steps, seconds) when first solved
    syncs_per_iteration: float | None = None  # unintended, trainer side, WATCHED_ITERATIONS
    sync_sites: list[str] = field(default_factory=list)
    timeline: list[tuple[str, float, float]] = field(default_factory=list)
    final_return: float | None = None
    first_iteration_at: tuple[int, float] | None = None  # (env steps, seconds) after iteration 1
    resumed_at_steps: int = 0  # env steps already done by the run this one resumed
    policy: dict | None = None  # the final policy (nostall.policy.policy_record), for policy.pt
    dropped_chunks: int = 0  # chunks lost with a rollout worker (Ray), never trained on
    dropped_causes: list[str] = field(default_factory=list)

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
