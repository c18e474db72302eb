"""SyncWatch's overhead: the same training step with and without the watch, side by side.

Two workloads: a small MLP update (many tiny ops: the worst case, since the watch's cost is per
op) and a larger one (fewer, heavier ops). Prints milliseconds per step and the slowdown.

    python benchmarks/profiler/bench_overhead.py [--steps 50]
"""

import argparse
import statistics
import time

import torch

from nostall.profiler import SyncWatch


def make_step(width: int, batch: int):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(64, width),
        torch.nn.Tanh(),
        torch.nn.Linear(width, width),
        torch.nn.Tanh(),
        torch.nn.Linear(width, 8),
    )
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 64), torch.randn(batch, 8)

    def step():
        loss = (net(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return net, step


def ms_per_step(step, steps: int, watch: SyncWatch | None) -> float:
    step()  # warm-up (optimizer state)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        if watch is None:
            step()
        else:
            with watch:
                step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"SyncWatch overhead, torch {torch.__version__}, one thread, median of {args.steps}")
    for name, width, batch in (("small MLP", 64, 32), ("large MLP", 1024, 4096)):
        net, step = make_step(width, batch)
        plain = ms_per_step(step, args.steps, None)
        watched = ms_per_step(step, args.steps, SyncWatch(net))
        print(
            f"  {name:10s} plain {plain:8.3f} ms/step   watched {watched:8.3f} ms/step   "
            f"{watched / plain:6.2f}x"
        )


if __name__ == "__main__":
    main()
