"""The rollout backends side by side: thread, process and Ray (1 and 2 workers, a local
cluster on this machine), on the same PPO run, in one run of this script.

1. Transport: a rollout-only loop (next_chunk, release, publish the weights; no update), so
   the time per chunk is the rollout's plus the backend's hand-over. The hand-over cost is the
   difference to the thread backend's time per chunk, and MB/s is the chunk's bytes over the
   time per chunk.
2. PPO's steady steps/s on each backend, staleness 1 (appo), on two workloads: the native
   rollout (one C++ call a chunk, about 2 ms) and a rollout stepped from Python
   (--no-native-rollout, about 20 ms a chunk: the balanced workload).

    python benchmarks/loop/bench_backends.py [--chunks 200] [--steps 40960]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root

from nostall.algos import appo, ppo
from nostall.algos.ppo.policies import make_agent
from nostall.algos.ppo.setup import make_run_env, make_transport

BACKENDS = {  # name: (backend, num_workers)
    "thread": ("thread", 1),
    "process": ("process", 1),
    "ray, 1 worker": ("ray", 1),
    "ray, 2 workers": ("ray", 2),
}


def _runtime(backend: str, workers: int, args: ppo.PPOConfig, native: bool):
    """The transport PPO builds for `backend` (staleness 1), and the agent it publishes."""
    args = dataclasses.replace(
        args, backend=backend, num_workers=workers, staleness=1, seed=0, native_rollout=native
    )
    env = make_run_env(args)
    agent = make_agent(env)
    return make_transport(args, env, agent), agent


def transport(backend: str, workers: int, chunks: int, native: bool) -> tuple[float, int]:
    """(seconds per chunk, bytes per chunk) of a rollout-only loop."""
    args = ppo.PPOConfig()
    runtime, agent = _runtime(backend, workers, args, native)
    with runtime:
        for i in range(chunks + 10):
            if i == 10:  # after warm-up
                start = time.perf_counter()
            slot, chunk = runtime.next_chunk()
            runtime.release(slot)
            runtime.publish(agent)
        seconds = (time.perf_counter() - start) / chunks
    size = sum(t.numel() * t.element_size() for t in chunk.tensors().values())
    return seconds, size


def ppo_speed(backend: str, workers: int, steps: int, native: bool) -> tuple[float, float, float]:
    """(steady steps/s, mean ms a chunk's rollout takes, mean ms an update takes)."""
    args = appo.APPOConfig(
        backend=backend,
        num_workers=workers,
        total_timesteps=steps,
        native_rollout=native,
        watch_syncs=False,
        log_interval=1,
    )
    result = appo.train(args)
    return result.steady_steps_per_second, result.side_ms("rollout"), result.side_ms("train")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=8 * 128 * 40)
    parser.add_argument("--python-steps", type=int, default=8 * 128 * 12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    print("Rollout-only loop, CartPole-v1, 8 envs x 128 steps a chunk (staleness 1)")
    for native in (True, False):
        kind = "native rollout" if native else "rollout stepped from Python"
        chunks = args.chunks if native else max(20, args.chunks // 8)
        print(f"  {kind}, {chunks} chunks")
        base = None
        for name, (backend, workers) in BACKENDS.items():
            seconds, size = transport(backend, workers, chunks, native)
            base = seconds if base is None else base
            print(
                f"    {name:15s} {seconds * 1e6:9.0f} us/chunk  {size / seconds / 1e6:7.1f} MB/s"
                f"  hand-over vs thread {1e6 * (seconds - base):+8.0f} us"
            )
    print("PPO (appo, staleness 1) steady steps/s, CartPole-v1, 8 envs x 128 steps")
    for native in (True, False):
        kind = "native rollout" if native else "rollout stepped from Python"
        steps = args.steps if native else args.python_steps
        runs = {}
        for name, (backend, workers) in BACKENDS.items():
            runs[name] = sorted(ppo_speed(backend, workers, steps, native) for _ in range(2))
        print(f"  {kind}, {steps} steps a run (the faster of 2)")
        for name, results in runs.items():
            speed, rollout_ms, update_ms = results[-1]
            ratio = speed / runs["process"][-1][0]
            print(
                f"    {name:15s} {speed:9.0f} steps/s  {ratio:5.2f}x the process backend"
                f"  (rollout {rollout_ms:5.1f} ms, update {update_ms:5.1f} ms a chunk)"
            )


if __name__ == "__main__":
    main()
