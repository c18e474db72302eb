"""PPO's steps per second on environments nostall does not ship, against a CleanRL-style loop
over the same environments at the same sizes, side by side in one run:

- Acrobot-v1 from Gymnasium (SyncVectorEnv, same-step autoreset): nostall through its
  Gymnasium adapter against CleanRL's ppo.py loop (MLP);
- Pong-v5 from EnvPool (frames stacked by EnvPool, [4, 84, 84] uint8): nostall through its
  EnvPool adapter with the Nature CNN against CleanRL's ppo_atari_envpool.py loop (the same CNN).

The same hyperparameters on both sides (nostall's PPO defaults, with the sizes below); steady
steps/s after the first iteration, median over the seeds; one torch thread. nostall's
asynchronous PPO (appo: rollout overlapped with the update, V-trace) is reported beside its
synchronous PPO; the speed, not the algorithm, is what it adds.

    python benchmarks/loop/bench_any_env.py [--seeds 3] [--pong-steps 2048]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root

from benchmarks.loop import cleanrl_ppo
from benchmarks.loop.bench_ppo import _EnvPoolVector
from nostall.algos import appo, ppo

CASES = {
    # name: (env_id, env_backend, num_envs, num_steps)
    "Acrobot-v1 (Gymnasium)": ("Acrobot-v1", "gymnasium", 8, 128),
    "Pong-v5 (EnvPool, CNN)": ("Pong-v5", "envpool", 8, 32),
}


def ours(env_id, backend, num_envs, num_steps, steps, seed, algo=ppo) -> float:
    args = (appo.APPOConfig if algo is appo else ppo.PPOConfig)(
        env_id=env_id,
        env_backend=backend,
        num_envs=num_envs,
        num_steps=num_steps,
        total_timesteps=steps,
        seed=seed,
        watch_syncs=False,
        log_interval=1,
    )
    return algo.train(args).steady_steps_per_second


def cleanrl(env_id, backend, num_envs, num_steps, steps, seed) -> float:
    args = ppo.PPOConfig(num_envs=num_envs, num_steps=num_steps, total_timesteps=steps, seed=seed)
    if backend == "gymnasium":
        same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        envs = gym.make_vec(env_id, num_envs, vectorization_mode="sync", vector_kwargs=same_step)
        make_agent = None
    else:
        import envpool

        envs = _EnvPoolVector(
            envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, num_threads=0)
        )
        make_agent = cleanrl_ppo.AtariAgent
    try:
        result = cleanrl_ppo.train(envs, args, solved_return=float("inf"), make_agent=make_agent)
    finally:
        envs.close()
    return result["steady_sps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--acrobot-steps", type=int, default=8 * 128 * 6)
    parser.add_argument("--pong-steps", type=int, default=8 * 32 * 6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    print(f"PPO steady steps/s, {args.seeds} seeds, one torch thread")
    for name, case in CASES.items():
        steps = args.pong_steps if "Pong" in name else args.acrobot_steps
        runs = {"nostall ppo": [], "nostall appo": [], "cleanrl-style": []}
        for seed in range(args.seeds):  # interleaved
            runs["nostall ppo"].append(ours(*case, steps, seed))
            runs["nostall appo"].append(ours(*case, steps, seed, algo=appo))
            runs["cleanrl-style"].append(cleanrl(*case, steps, seed))
        medians = {k: statistics.median(v) for k, v in runs.items()}
        print(f"  {name}, {case[2]} envs x {case[3]} steps, {steps} steps a run")
        for k, v in runs.items():
            print(f"    {k:14s} {medians[k]:9.1f} steps/s  [{', '.join(f'{x:.0f}' for x in v)}]")
        for k in ("nostall ppo", "nostall appo"):
            print(f"    => {k} {medians[k] / medians['cleanrl-style']:.2f}x the steps/s")


if __name__ == "__main__":
    main()
