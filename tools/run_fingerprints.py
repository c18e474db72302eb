"""Fingerprints of short seeded runs on every transport: the last rewards (or returns) and a hash
of the final weights. A change that must not alter what any run computes (a refactor) is checked
by running this before and after it and comparing the output line for line:

    python tools/run_fingerprints.py > before.txt      # on the commit before
    python tools/run_fingerprints.py > after.txt       # on the change
    diff before.txt after.txt

(In-flight weight swaps are left out: where a swap lands depends on timing, so two runs of the
same code differ.)"""

from __future__ import annotations

import hashlib
import sys

import torch

from nostall.algos import appo, grpo, ppo


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


GRPO_RUNS = {
    "grpo thread staleness 0": dict(staleness=0),
    "grpo thread staleness 1": dict(staleness=1),
    "grpo process staleness 1": dict(staleness=1, backend="process"),
    "grpo lora": dict(staleness=0, lora_r=4),
    "grpo ray staleness 1": dict(staleness=1, backend="ray"),
}
PPO_RUNS = {
    "ppo": (ppo, dict()),
    "ppo constant rate": (ppo, dict(anneal_lr=False)),
    "appo process": (appo, dict(backend="process")),
    "ppo ray": (ppo, dict(backend="ray")),
}


def main(names: list[str]) -> None:
    for name, options in GRPO_RUNS.items():
        if names and name not in names:
            continue
        args = grpo.GRPOCommandConfig(
            steps=12, seed=7, watch_syncs=False, log_interval=4, **options
        )
        trainer = grpo.GRPOTrainer(args=args)
        rewards = trainer.train().rewards
        print(name, [round(r, 6) for r in rewards[-4:]], digest(trainer.model.state_dict()))
    for name, (algo, options) in PPO_RUNS.items():
        if names and name not in names:
            continue
        config = algo.APPOConfig if algo is appo else algo.PPOConfig
        args = config(
            total_timesteps=8 * 128 * 6, seed=3, watch_syncs=False, log_interval=1, **options
        )
        result = algo.train(args)
        print(name, [c[2] for c in result.curve[-3:]], digest(result.policy["state_dict"]))


if __name__ == "__main__":  # (the process transport spawns: this module is imported again)
    main(sys.argv[1:])
