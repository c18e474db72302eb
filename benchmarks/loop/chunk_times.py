"""Per-chunk time of each side (rollout, trainer) and steady steps/s, synchronous (thread,
staleness 0) against asynchronous (staleness 1, the rollout side in a thread and in a process),
for a number of update epochs and either rollout path: how balanced the two sides are, and what
overlapping them gains.

    python benchmarks/loop/chunk_times.py [--update-epochs 4] [--rollout native|steps]
        [--iterations 150]

`--rollout steps` collects one Python policy call per step (any policy; about 20 ms a chunk),
which with 4 update epochs makes the two sides about equal: the workload of the asynchronous
goal. `native` is the trainers' default (one native call a chunk).
"""

import argparse
import statistics

from nostall.algos import appo, ppo

WARM_UP = 10  # chunks left out: a rollout process's spawn and first calls, allocator warm-up


def steady_steps_per_second(timeline, steps_per_chunk: int) -> float:
    """From the trainer's chunk ends past warm-up: chunks trained per second, in steps."""
    ends = [end for side, _, end in timeline if side == "train"][WARM_UP:]
    return (len(ends) - 1) * steps_per_chunk / (ends[-1] - ends[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--rollout", choices=("native", "steps"), default="steps")
    parser.add_argument("--iterations", type=int, default=150)
    cli = parser.parse_args()
    sync_sps = None
    for module, backend in ((ppo, "thread"), (appo, "thread"), (appo, "process")):
        args = (appo.APPOConfig if module is appo else ppo.PPOConfig)(
            total_timesteps=cli.iterations * 1024,
            update_epochs=cli.update_epochs,
            backend=backend,
            watch_syncs=False,
            log_interval=10**9,
            native_rollout=cli.rollout == "native",
        )
        result = module.train(args)
        timeline = result.timeline
        if timeline.recorded > len(timeline.spans):
            raise SystemExit(f"--iterations {cli.iterations}: more spans than the timeline keeps")
        spans: dict[str, list[float]] = {}
        for side, start, end in timeline.spans[2 * WARM_UP :]:
            spans.setdefault(side, []).append((end - start) * 1e3)
        medians = ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in sorted(spans.items()))
        sps = steady_steps_per_second(timeline.spans, args.batch_size)
        ratio = f"  ({sps / sync_sps:.2f}x synchronous)" if sync_sps else ""
        sync_sps = sync_sps or sps
        print(
            f"{module.__name__} ({backend}), {cli.rollout} rollout, {cli.update_epochs} epochs: "
            f"per chunk {medians}; steady {sps:,.0f} steps/s{ratio}"
        )


if __name__ == "__main__":
    main()
