"""End to end: wall-clock time until CartPole-v1 reaches a mean return of 475 (last 20
episodes), and environment steps per second, over several seeds, side by side:

- nostall PPO (synchronous, staleness 0) and nostall asynchronous PPO (staleness 1, V-trace),
  its rollout side in a thread and in a process;
- a CleanRL-style PPO written in this repo (cleanrl_ppo.py) over Gymnasium's vector env;
- the same over EnvPool.

The same hyperparameters where they apply (8 envs x 128 steps, 4 minibatches, 4 epochs,
lr 2.5e-3 annealed, gamma 0.99, lambda 0.95, clip 0.2, entropy 0.01), one torch thread.
Prints medians and ratios. Steps per second twice: over the whole run (start-up included, as
in the time to 475), and steady, after the first iteration (without a rollout process's spawn
and first-call warm-up; the runs stop when solved, after a few seconds, so start-up weighs).

    python benchmarks/loop/bench_ppo.py [--seeds 5] [--max-steps 300000]
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import gymnasium as gym
import torch

from nostall.algos import appo, ppo

try:
    from benchmarks.loop import cleanrl_ppo
except ImportError:  # run as a script from anywhere
    import importlib.util
    from pathlib import Path

    _spec = importlib.util.spec_from_file_location(
        "cleanrl_ppo", Path(__file__).with_name("cleanrl_ppo.py")
    )
    cleanrl_ppo = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(cleanrl_ppo)


def nostall_run(module, seed: int, max_steps: int, backend: str = "thread") -> dict:
    # Metrics every iteration, to time the solve precisely; no SyncWatch diagnostic.
    args = module.Args(
        seed=seed,
        total_timesteps=max_steps,
        stop_when_solved=True,
        log_interval=1,
        watch_syncs=False,
        backend=backend,
    )
    result = module.train(args)
    return {
        "solved_s": result.solved_at[1] if result.solved_at else None,
        "steps": result.steps,
        "seconds": result.seconds,
        "steady_sps": result.steady_steps_per_second,
    }


class _EnvPoolVector:
    """EnvPool's env under the vector-env attribute names the baseline reads."""

    def __init__(self, pool):
        self.pool = pool
        self.single_observation_space = pool.observation_space
        self.single_action_space = pool.action_space

    def reset(self, seed=None):
        return self.pool.reset()

    def step(self, actions):
        return self.pool.step(actions)

    def close(self):
        self.pool.close()


def baseline_run(kind: str, seed: int, max_steps: int) -> dict:
    args = ppo.Args(seed=seed, total_timesteps=max_steps)
    if kind == "gymnasium":
        envs = gym.make_vec(
            "CartPole-v1",
            args.num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        )
    else:
        import envpool  # a benchmark-only dependency

        envs = _EnvPoolVector(
            envpool.make(
                "CartPole-v1", env_type="gymnasium", num_envs=args.num_envs, seed=seed,
                num_threads=1,
            )
        )  # fmt: skip
    try:
        return cleanrl_ppo.train(envs, args)
    finally:
        envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=300_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    variants = {
        "nostall ppo (S=0)": lambda s: nostall_run(ppo, s, args.max_steps),
        "nostall appo (S=1)": lambda s: nostall_run(appo, s, args.max_steps, "thread"),
        "nostall appo (S=1, process)": lambda s: nostall_run(appo, s, args.max_steps, "process"),
        "cleanrl-style / gymnasium": lambda s: baseline_run("gymnasium", s, args.max_steps),
        "cleanrl-style / envpool": lambda s: baseline_run("envpool", s, args.max_steps),
    }
    print(f"PPO on CartPole-v1 to a mean return of 475, {args.seeds} seeds, one torch thread")
    # Seeds outermost: every variant runs once per round, so a slow phase of the machine falls on
    # all of them alike rather than on one.
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for seed in range(args.seeds):
        for name, run in variants.items():
            results[name].append(run(seed))
    medians = {}
    for name, runs in results.items():
        solved = [r["solved_s"] for r in runs if r["solved_s"] is not None]
        sps = statistics.median(r["steps"] / r["seconds"] for r in runs)
        steady = statistics.median(r["steady_sps"] for r in runs)
        to_solve = statistics.median(solved) if len(solved) == len(runs) else None
        medians[name] = (to_solve, sps, steady)
        times = ", ".join(f"{r['solved_s']:.1f}" if r["solved_s"] else "unsolved" for r in runs)
        shown = f"{to_solve:7.2f} s" if to_solve is not None else "    n/a"
        print(
            f"  {name:28s} time to 475 (median) {shown}   steps/s {sps:6.0f}, steady "
            f"{steady:6.0f}   [{times}]"
        )
    baselines = [v for k, v in medians.items() if k.startswith("cleanrl")]
    fastest = min((t for t, _, _ in baselines if t is not None), default=None)
    best_sps = max(s for _, s, _ in baselines)
    for name in ("nostall ppo (S=0)", "nostall appo (S=1)", "nostall appo (S=1, process)"):
        t, s, _ = medians[name]
        speed = f"{fastest / t:.2f}x faster to 475" if t and fastest else "n/a to 475"
        print(f"  => {name}: {speed} than the fastest baseline; {s / best_sps:.2f}x its steps/s")
    _, sync_sps, sync_steady = medians["nostall ppo (S=0)"]
    for name in ("nostall appo (S=1)", "nostall appo (S=1, process)"):
        _, s, steady = medians[name]
        print(
            f"  => {name} / synchronous steps/s: {s / sync_sps:.2f}x over the whole run, "
            f"{steady / sync_steady:.2f}x steady (after the first iteration)"
        )


if __name__ == "__main__":
    main()
