"""End to end: PPO on CartPole-v1 to a mean return of 475 (last 20 episodes), nostall against
the peers a user would pick, each configured as its users configure it:

- Stable-Baselines3 PPO with the RL Zoo's tuned CartPole-v1 hyperparameters (sb3_ppo.py);
- a CleanRL-style PPO (cleanrl_ppo.py) over Gymnasium's vector env and over EnvPool, with
  nostall's default hyperparameters, bootstrapping truncated episodes as nostall does (and once
  over Gymnasium as CleanRL does, truncation taken as termination);
- nostall PPO with its defaults (tuned for this, see PPOConfig), its asynchronous variant
  (staleness 1, V-trace) in a thread and in a process, and nostall PPO with the Zoo's
  hyperparameters: the algorithm held equal to SB3's, for a pure systems comparison;
- `nostall train ppo` and `nostall train appo` exactly as a user types them (the defaults:
  200k steps, metrics every 10 iterations, report, plots and sync check): the headline figures.

Reported apart, since they answer different questions: steps to solve (sample efficiency: the
hyperparameters and the algorithm), steady steps/s after the first iteration (systems speed),
time to solve (both), and the whole process's wall time (interpreter, imports and set-up
included). Every run is a fresh process; seeds are interleaved (each round runs every variant
once, so a slow phase of the machine falls on all alike); medians with min-max spread. One
torch thread everywhere.

    python benchmarks/loop/bench_ppo.py [--seeds 5] [--first-seed 100] [--max-steps 300000]
                                        [--only NAME ...]

Seeds 100.. by default: the defaults were tuned on seeds 0-3 and checked on 4-11.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOLVED = 475.0

# The RL Zoo's CartPole-v1 settings mapped onto nostall's flags (sb3_ppo.ZOO_CARTPOLE): one
# 256-sample minibatch, 20 epochs, no value clipping (SB3's default). SB3 also anneals the
# clip range, which nostall's PPO keeps fixed: the one difference left.
NOSTALL_ZOO = {
    "num_envs": 8,
    "num_steps": 32,
    "num_minibatches": 1,
    "update_epochs": 20,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "ent_coef": 0.0,
    "learning_rate": 1e-3,
    "clip_vloss": False,
    "total_timesteps": 100_000,
}

VARIANTS = {
    # name: (kind, options)
    "nostall ppo (S=0)": ("nostall", {"algo": "ppo"}),
    "nostall appo (S=1)": ("nostall", {"algo": "appo"}),
    "nostall appo (S=1, process)": ("nostall", {"algo": "appo", "backend": "process"}),
    "nostall ppo, Zoo hyperparams": ("nostall", {"algo": "ppo", "args": NOSTALL_ZOO}),
    "nostall train ppo (command)": ("command", {"algo": "ppo"}),
    "nostall train appo (command)": ("command", {"algo": "appo"}),
    "sb3 ppo (RL Zoo tuned)": ("sb3", {}),
    "cleanrl-style / gymnasium": ("cleanrl", {"env": "gymnasium", "bootstrap": True}),
    "cleanrl-style / envpool": ("cleanrl", {"env": "envpool", "bootstrap": True}),
    "cleanrl-style / gym, no bootstrap": ("cleanrl", {"env": "gymnasium", "bootstrap": False}),
}
BASELINES = [name for name, (kind, _) in VARIANTS.items() if kind in ("sb3", "cleanrl")]


# -- one run, in this process (called in a fresh child by the parent) ---------------------------
def run_nostall(options: dict, seed: int, max_steps: int) -> dict:
    from nostall.algos import appo, ppo

    module = appo if options["algo"] == "appo" else ppo
    # Metrics every iteration, to time the solve precisely; no SyncWatch diagnostic.
    args = (appo.APPOConfig if module is appo else ppo.PPOConfig)(
        seed=seed,
        total_timesteps=max_steps,
        stop_when_solved=True,
        log_interval=1,
        watch_syncs=False,
        backend=options.get("backend", "thread"),
    )
    for name, value in options.get("args", {}).items():
        setattr(args, name, value)
    result = module.train(args)
    return {
        "solved_s": result.solved_at[1] if result.solved_at else None,
        "solved_steps": result.solved_at[0] if result.solved_at else None,
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


def run_cleanrl(options: dict, seed: int, max_steps: int) -> dict:
    import gymnasium as gym

    from benchmarks.loop import cleanrl_ppo
    from nostall.algos import ppo

    args = ppo.PPOConfig(seed=seed, total_timesteps=max_steps)
    if options["env"] == "gymnasium":
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
                "CartPole-v1",
                env_type="gymnasium",
                num_envs=args.num_envs,
                seed=seed,
                num_threads=1,
            )
        )
    try:
        return cleanrl_ppo.train(envs, args, SOLVED, bootstrap_truncation=options["bootstrap"])
    finally:
        envs.close()


def run_sb3(options: dict, seed: int, max_steps: int) -> dict:
    from benchmarks.loop import sb3_ppo

    return sb3_ppo.train(seed, max_steps, SOLVED)


def run_one(name: str, seed: int, max_steps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    kind, options = VARIANTS[name]
    runner = {"nostall": run_nostall, "cleanrl": run_cleanrl, "sb3": run_sb3}[kind]
    return runner(options, seed, max_steps)


# -- the parent: every run a fresh process, timed whole --------------------------------------
def spawn(name: str, seed: int, max_steps: int) -> dict:
    kind, options = VARIANTS[name]
    with tempfile.TemporaryDirectory() as out:
        if kind == "command":  # exactly what a user types (the defaults), report and plots
            command = [
                sys.executable,
                "-m",
                "nostall",
                "train",
                options["algo"],
                "--env",
                "CartPole-v1",
                "--seed",
                str(seed),
                "--no-progress",
                "--out",
                out,
            ]
        else:
            command = [
                sys.executable,
                "-m",
                "benchmarks.loop.bench_ppo",
                "--run",
                name,
                "--seed",
                str(seed),
                "--max-steps",
                str(max_steps),
            ]
        began = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"{name}, seed {seed}, failed:\n{done.stderr[-3000:]}")
        if kind == "command":
            report = json.loads((Path(out) / "report.json").read_text())
            run = {
                "solved_s": report["time_to_solve_s"],
                "solved_steps": report["solved_at_steps"],
                "steps": report["env_steps"],
                "seconds": report["seconds"],
                # No steady figure: the whole run, which trains on past the solve to the
                # default 200k steps.
                "steady_sps": report["steps_per_second"],
            }
        else:
            run = json.loads(done.stdout.strip().splitlines()[-1])
    run["wall_s"] = wall
    return run


def _spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-" + (
        f"{fmt.format(max(values))}]"
    )


def summarise(results: dict[str, list[dict]]) -> dict[str, dict]:
    table = {}
    for name, runs in results.items():
        solved = [r for r in runs if r["solved_s"] is not None]
        every = len(solved) == len(runs)
        table[name] = {
            "every_seed_solved": every,
            "time": statistics.median(r["solved_s"] for r in runs) if every else None,
            "steps": statistics.median(r["solved_steps"] for r in runs) if every else None,
            "sps": statistics.median(r["steady_sps"] for r in runs),
            "wall": statistics.median(r["wall_s"] for r in runs),
        }
        times = [r["solved_s"] for r in solved]
        steps = [r["solved_steps"] / 1e3 for r in solved]
        print(f"  {name}")
        print(
            f"    solved {len(solved)}/{len(runs)}; time to 475 "
            f"{_spread(times, '{:.2f}') if times else 'n/a'} s; steps to 475 "
            f"{_spread(steps, '{:.1f}') if steps else 'n/a'} k; steady steps/s "
            f"{_spread([r['steady_sps'] for r in runs], '{:.0f}')}; whole process "
            f"{_spread([r['wall_s'] for r in runs], '{:.1f}')} s"
        )
    return table


def ratios(table: dict[str, dict]) -> None:
    solved = [n for n in BASELINES if table[n]["time"] is not None]
    if not solved:
        print("  no baseline solved on every seed: no ratios")
        return
    fastest = min(solved, key=lambda n: table[n]["time"])
    fewest = min(solved, key=lambda n: table[n]["steps"])
    speediest = max(BASELINES, key=lambda n: table[n]["sps"])
    quickest = min(solved, key=lambda n: table[n]["wall"])
    print(
        f"  fastest baseline to 475: {fastest}; fewest steps: {fewest}; most steps/s: "
        f"{speediest}; shortest whole process: {quickest}"
    )
    for name in VARIANTS:
        if name in BASELINES:
            continue
        row = table[name]
        if row["time"] is None:
            print(f"  => {name}: not solved on every seed")
            continue
        print(
            f"  => {name}: {table[fastest]['time'] / row['time']:.2f}x faster to 475; "
            f"{table[fewest]['steps'] / row['steps']:.2f}x the sample efficiency; "
            f"{row['sps'] / table[speediest]['sps']:.2f}x the steps/s; whole process "
            f"{table[quickest]['wall'] / row['wall']:.2f}x shorter"
        )
    # The algorithm held equal: the same updates on the same data, so steps/s is the system.
    held = (
        ("nostall ppo, Zoo hyperparams", "sb3 ppo (RL Zoo tuned)"),
        ("nostall ppo (S=0)", "cleanrl-style / gymnasium"),
        ("nostall ppo (S=0)", "cleanrl-style / envpool"),
    )
    for ours, theirs in held:
        print(
            f"  => algorithm held equal, {ours} over {theirs}: "
            f"{table[ours]['sps'] / table[theirs]['sps']:.2f}x steady steps/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--first-seed",
        type=int,
        default=100,
        help="seeds first-seed.. (the defaults were tuned on 0-3, checked on "
        "4-11: the default race runs on seeds no setting was tuned on)",
    )
    parser.add_argument("--max-steps", type=int, default=300_000)
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), help="run just these")
    parser.add_argument("--run", choices=list(VARIANTS), help=argparse.SUPPRESS)  # a child
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_one(args.run, args.seed, args.max_steps)))
        return
    names = args.only or list(VARIANTS)
    print(
        f"PPO on CartPole-v1 to a mean return of {SOLVED:.0f} (20 episodes), seeds "
        f"{args.first_seed}-{args.first_seed + args.seeds - 1}, one torch thread; medians "
        "[min-max]"
    )
    results: dict[str, list[dict]] = {name: [] for name in names}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for name in names:
            results[name].append(spawn(name, seed, args.max_steps))
    table = summarise(results)
    if set(VARIANTS) <= set(names):
        ratios(table)


if __name__ == "__main__":
    main()
