"""How nostall's GRPO defaults were chosen: steps and seconds to a mean reward of 0.7 (copy,
tiny model) for the TRL-equal configuration (synchronous) and the variants a user would try
first, synchronous and with generation a version ahead, seeds 1-3, one torch thread. Steps
(sample efficiency) and ms per step (speed) are printed apart.

    python -m benchmarks.lm.sweep_grpo [--seeds 3] [--first-seed 1] [--time-limit 40]
        [--only "staleness 1"]
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.lm.bench_grpo import SAME_AS_TRL, TARGET
from nostall.algos import grpo

VARIANTS = {
    "TRL-equal (synchronous)": {},
    "lr 3e-3": dict(learning_rate=3e-3),
    "lr 5e-3": dict(learning_rate=5e-3),
    "2 updates per batch": dict(updates_per_batch=2),
    "2 updates, lr 1e-3": dict(updates_per_batch=2, learning_rate=1e-3),
    "clip high 0.28": dict(clip_high=0.28),
    "4 prompts x 16": dict(num_prompts=4, num_generations=16),
    "scale rewards by batch": dict(scale_rewards="batch"),
    "lr 1e-3": dict(learning_rate=1e-3),
    "staleness 1": dict(staleness=1),
    "staleness 1, lr 1e-3": dict(staleness=1, learning_rate=1e-3),
    "staleness 1, lr 1.2e-3": dict(staleness=1, learning_rate=1.2e-3),
    "staleness 1, lr 1e-3, cap 5": dict(staleness=1, learning_rate=1e-3, is_cap=5.0),
    "staleness 1, lr 9e-4": dict(staleness=1, learning_rate=9e-4),
    "staleness 1, lr 1.1e-3": dict(staleness=1, learning_rate=1.1e-3),
    "staleness 1, lr 1e-3, cap 3": dict(staleness=1, learning_rate=1e-3, is_cap=3.0),
    "staleness 1, cap 1": dict(staleness=1, is_cap=1.0),
    "staleness 1, lr 1.5e-3": dict(staleness=1, learning_rate=1.5e-3),
    "staleness 1, lr 1.5e-3, cap 1.5": dict(staleness=1, learning_rate=1.5e-3, is_cap=1.5),
    "staleness 1, lr 1.5e-3, cap 1.2": dict(staleness=1, learning_rate=1.5e-3, is_cap=1.2),
    "staleness 1, lr 1.2e-3, clip high 0.28": dict(
        staleness=1, learning_rate=1.2e-3, clip_high=0.28
    ),
    "staleness 1, lr 1e-3, clip 0.3": dict(staleness=1, learning_rate=1e-3, clip_low=0.3),
    "staleness 1, lr 1e-3, loss grpo": dict(staleness=1, learning_rate=1e-3, loss_type="grpo"),
    "staleness 1, lr 1e-3, 4 prompts x 16": dict(
        staleness=1, learning_rate=1e-3, num_prompts=4, num_generations=16
    ),
    "staleness 1, lr 1.5e-3, 2 updates": dict(
        staleness=1, learning_rate=1.5e-3, updates_per_batch=2
    ),
    "staleness 1, lr 1.1e-3, entropy 0.003": dict(
        staleness=1, learning_rate=1.1e-3, entropy_coef=0.003
    ),
    "staleness 1, lr 1.1e-3, entropy 0.01": dict(
        staleness=1, learning_rate=1.1e-3, entropy_coef=0.01
    ),
    "staleness 1, lr 1.1e-3, entropy 0.03": dict(
        staleness=1, learning_rate=1.1e-3, entropy_coef=0.03
    ),
    "staleness 1, lr 1.1e-3, entropy 0.05": dict(
        staleness=1, learning_rate=1.1e-3, entropy_coef=0.05
    ),
    "staleness 1, lr 1.1e-3, entropy 0.1": dict(
        staleness=1, learning_rate=1.1e-3, entropy_coef=0.1
    ),
    "staleness 1, lr 1.5e-3, entropy 0.05": dict(
        staleness=1, learning_rate=1.5e-3, entropy_coef=0.05
    ),
    "staleness 1, lr 2e-3, entropy 0.05": dict(staleness=1, learning_rate=2e-3, entropy_coef=0.05),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--time-limit", type=float, default=40.0, help="seconds per run")
    p.add_argument("--only", default="", help="run the variants whose name contains this")
    a = p.parse_args()
    print(f"{'':32} {'solved':>7} {'steps (each seed)':>24} {'time s':>8} {'ms/step':>8}")
    for name, change in VARIANTS.items():
        if a.only not in name:
            continue
        runs = []
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            args = grpo.GRPOCommandConfig(
                **{**SAME_AS_TRL, **change},
                seed=seed,
                steps=2000,
                target_reward=TARGET,
                stop_when_solved=True,
                log_interval=1,
                watch_syncs=False,
            )
            r = grpo.train(args, time_limit_s=a.time_limit)
            runs.append((r.steps_to_target, r.time_to_target_s, 1e3 * r.seconds / len(r.rewards)))
        solved = [r for r in runs if r[0] is not None]
        steps = ", ".join("never" if r[0] is None else str(r[0]) for r in runs)
        time = f"{statistics.median(r[1] for r in solved):8.2f}" if solved else f"{'-':>8}"
        print(
            f"{name:32} {len(solved)}/{len(runs):<5} {steps:>24} {time} "
            f"{statistics.median(r[2] for r in runs):8.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
