"""The cost of writing a long run's outputs (report.json, report.txt, learning_curve.png,
timeline.png): a GRPO result of N steps with its timeline recorded span by span, as a run
records it, then `write_outputs`; beside it the overlap as the report computed it before (every
span of one side against every busy interval of the other), timed at sizes it finishes and
scaled by its n x m to N.

    python -m benchmarks.loop.outputs_cost [--steps 200000]
"""

from __future__ import annotations

import argparse
import random
import resource
import tempfile
import time
from pathlib import Path

from nostall.algos.grpo.config import GRPOCommandConfig
from nostall.algos.grpo.result import GRPOResult
from nostall.runtime.overlap import union
from nostall.runtime.timeline import Timeline
from nostall.train.outputs import write_outputs


def alternating_run(steps: int, seed: int = 0, lag: int = 2) -> list[tuple[str, float, float]]:
    """A run's spans in the order a trainer records them: each chunk's generation, then the
    update on it, generation running ahead into the update; each chunk handed over `lag`
    updates after it was generated (it waited in the queue), as the process backend does."""
    rng = random.Random(seed)
    t, spans, waiting = 0.0, [], []
    for _ in range(steps):
        generate, update = rng.uniform(1e-3, 4e-3), rng.uniform(1e-3, 4e-3)
        waiting.append(("rollout", t, t + generate))
        spans.append(("train", t + generate / 2, t + generate / 2 + update))
        if len(waiting) > lag:
            spans.append(waiting.pop(0))
        t += generate / 2 + update
    return spans + waiting


def pairwise_overlap(spans, side: str, other: str) -> float | None:
    """The report's overlap until this round: for each span of `side`, every busy interval of
    `other` (O(n x m))."""
    busy = union([(s, e) for name, s, e in spans if name == other])
    total = shared = 0.0
    for name, start, end in spans:
        if name != side:
            continue
        total += end - start
        for s, e in busy:
            shared += max(0.0, min(end, e) - max(start, s))
    return shared / total if total > 0 else None


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    cli = parser.parse_args()
    spans = alternating_run(cli.steps)
    before = peak_mib()
    start = time.perf_counter()
    timeline = Timeline.of(spans)
    record_s = time.perf_counter() - start
    result = GRPOResult(
        args={**vars(GRPOCommandConfig()), "dataset": ""},
        timeline=timeline,
        rewards=[(i % 100) / 100 for i in range(cli.steps)],
        step_times=[s for side, s, _ in spans if side == "train"],
    )
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        write_outputs(result, Path(out), "a synthetic run")
        write_s = time.perf_counter() - start
    kept = len(timeline.spans) + sum(len(m.pending) for m in timeline._meters.values())
    print(
        f"{cli.steps:,} steps, {timeline.recorded:,} spans: recording them {record_s:.2f} s "
        f"({1e6 * record_s / timeline.recorded:.1f} us a span), write_outputs {write_s:.2f} s; "
        f"{kept:,} spans kept at the end; peak memory +{peak_mib() - before:.0f} MiB "
        f"(the synthetic spans included)"
    )
    # The pairwise overlap at sizes it finishes, scaled by n x m.
    for steps in (2_000, 8_000):
        part = alternating_run(steps)
        start = time.perf_counter()
        pairwise_overlap(part, "train", "rollout")
        seconds = time.perf_counter() - start
        scaled = seconds * (cli.steps / steps) ** 2
        print(
            f"  pairwise overlap at {steps:,} steps: {seconds:.2f} s; scaled to {cli.steps:,}: "
            f"{scaled:,.0f} s ({scaled / write_s:,.0f}x write_outputs now)"
        )


if __name__ == "__main__":
    main()
