"""A model of the Ray backend's steps/s from 1 to 128 rollout workers, from per-chunk costs
measured on this machine (bench_backends.py), with the plot in docs/scaling.png.

Per chunk of N envs x T steps:
- R: a worker fills it (its rollout), plus the object-store round trip (hand-over);
- U: the trainer updates on it, plus receiving it (copy out of the store) and publishing;
- B: a weight version's `ray.put`, once per version, on the trainer's side.

Chunks are handed to the trainer in request order and at most S + 1 of them are ahead of it
(the staleness bound), so at most min(K, S + 1) workers are busy at once; and C cores cannot
do more than C core-seconds of rollout and update a second:

    chunks/s = min(min(K, S + 1) / R, 1 / (U + B), C / (R + U + B))

On a cluster each worker has its own core (C = K + 1, the bound never binds); on this 2-core
machine C = 2, which is what the measured points at 1 and 2 workers are checked against.

It stops scaling where the trainer saturates (K R / (S + 1) no longer hides U + B) or where the
staleness bound leaves workers idle; larger S or larger chunks per worker move both limits.

    python benchmarks/loop/scaling_model.py --rollout-ms R --update-ms U --put-ms B
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root

from nostall.train.outputs import figure

WORKERS = (1, 2, 4, 8, 16, 32, 64, 128)


def predicted(
    workers: int,
    staleness: int,
    rollout_s: float,
    update_s: float,
    put_s: float,
    chunk_steps: int,
    cores: int | None = None,
) -> float:
    busy = min(workers, staleness + 1)
    cores = workers + 1 if cores is None else cores
    work = rollout_s + update_s + put_s
    return chunk_steps * min(busy / rollout_s, 1.0 / (update_s + put_s), cores / work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollout-ms", type=float, required=True)
    parser.add_argument("--update-ms", type=float, required=True)
    parser.add_argument("--put-ms", type=float, default=0.1)
    parser.add_argument("--chunk-steps", type=int, default=8 * 128)
    parser.add_argument("--measured", default="", help="K=steps/s,... to mark on the plot")
    parser.add_argument("--cores", type=int, default=2, help="this machine's, for --measured")
    parser.add_argument("--plot", default="docs/scaling.png")
    args = parser.parse_args()
    r, u, b = args.rollout_ms / 1e3, args.update_ms / 1e3, args.put_ms / 1e3
    fig, ax = figure((7, 4.5))
    # The measured costs at two staleness bounds; with M data-parallel trainers (the update
    # divided by M, plus an all-reduce); and a rollout ten times the update (generation-bound,
    # as language-model RL is at scale): what the bound K* = R / (U + B) means in each case.
    curves = {
        "measured costs, S=1": (r, u, 1),
        "measured costs, S=127": (r, u, 127),
        "--trainers 4 (U/4 + 1 ms), S=127": (r, u / 4 + 1e-3, 127),
        "rollout 10x the update, S=127": (10 * u, u, 127),
    }
    print(f"{'workers':>8} " + " ".join(f"{name[:24]:>26}" for name in curves))
    table = {
        name: [predicted(k, st, rr, uu, b, args.chunk_steps) for k in WORKERS]
        for name, (rr, uu, st) in curves.items()
    }
    for i, k in enumerate(WORKERS):
        print(f"{k:8d} " + " ".join(f"{table[name][i]:26.0f}" for name in curves))
    for name, speeds in table.items():
        ax.plot(WORKERS, speeds, marker="o", label=f"model: {name}")
    if args.measured:
        points = [tuple(map(float, p.split("="))) for p in args.measured.split(",")]
        for k, measured in points:
            model = predicted(int(k), 1, r, u, b, args.chunk_steps, cores=args.cores)
            print(
                f"{int(k)} workers on {args.cores} cores, S=1: model {model:.0f} steps/s, "
                f"measured {measured:.0f} ({measured / model:.2f}x the model)"
            )
        ax.scatter(
            *zip(*points, strict=True),
            color="black",
            zorder=3,
            label=f"measured here ({args.cores} cores, S=1)",
        )
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rollout workers")
    ax.set_ylabel("steps/s")
    ax.set_title(
        f"Ray backend: rollout {args.rollout_ms} ms, update {args.update_ms} ms a chunk (measured)"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
