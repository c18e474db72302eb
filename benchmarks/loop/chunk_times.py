"""Per-chunk time of each side (rollout, trainer) and steady steps/s, synchronous (thread,
staleness 0) against asynchronous (rollout process, staleness 1), for a number of update epochs:
how balanced the two sides are, and what overlapping them gains.

    python benchmarks/loop/chunk_times.py [--update-epochs 4] [--iterations 60]
"""

import argparse
import statistics

from nostall.algos import appo, ppo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=60)
    cli = parser.parse_args()
    sync_sps = None
    for module, backend in ((ppo, "thread"), (appo, "process")):
        args = module.Args(
            total_timesteps=cli.iterations * 1024, update_epochs=cli.update_epochs,
            backend=backend, watch_syncs=False, log_interval=10**9,
        )  # fmt: skip
        result = module.train(args)
        spans: dict[str, list[float]] = {}
        for side, start, end in result.timeline[5:]:  # past warm-up
            spans.setdefault(side, []).append((end - start) * 1e3)
        medians = ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in sorted(spans.items()))
        sps = result.steady_steps_per_second
        ratio = f"  ({sps / sync_sps:.2f}x synchronous)" if sync_sps else ""
        sync_sps = sync_sps or sps
        print(f"{module.__name__} ({backend}), {cli.update_epochs} epochs: per chunk {medians}; "
              f"steady {sps:,.0f} steps/s{ratio}")  # fmt: skip


if __name__ == "__main__":
    main()
