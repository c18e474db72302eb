"""Stable-Baselines3 PPO on CartPole-v1 as the RL Zoo trains it: the Zoo's tuned
hyperparameters (hyperparams/ppo.yml, CartPole-v1) and its environment set-up (make_vec_env:
DummyVecEnv of Monitor-wrapped envs). Used by bench_ppo.py as the peer a user would pick.

SB3 bootstraps truncated episodes (the terminal observation's value), as nostall does."""

from __future__ import annotations

import time

import numpy as np

# The RL Zoo's entry for CartPole-v1. Its "lin_" schedules decay linearly to 0 over
# n_timesteps, so the run's length is part of the configuration.
ZOO_CARTPOLE = {
    "n_envs": 8,
    "n_timesteps": 100_000,
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": 1e-3,  # lin_0.001
    "clip_range": 0.2,  # lin_0.2
}


def _linear(initial: float):
    # The Zoo's linear_schedule: progress_remaining goes from 1 to 0 over the run.
    return lambda progress_remaining: progress_remaining * initial


def train(seed: int, max_steps: int, solved_return: float = 475.0, max_seconds: float = 600.0):
    """Train until the mean return of the last 20 episodes reaches solved_return; returns the
    same fields as the other runners: solved_s, solved_steps, steps, seconds, steady_sps."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    zoo = ZOO_CARTPOLE
    returns: list[float] = []
    marks: dict = {"start": None, "first": None, "solved": None}

    class Solved(BaseCallback):
        """Stops learn() once solved, reading the Monitor's episode returns as they end."""

        def _on_rollout_start(self) -> None:
            if marks["start"] is None:
                marks["start"] = time.perf_counter()
            elif marks["first"] is None:  # after the first rollout and update
                marks["first"] = (self.num_timesteps, time.perf_counter())

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    returns.append(info["episode"]["r"])
            recent = returns[-20:]
            if len(recent) == 20 and np.mean(recent) >= solved_return:
                marks["solved"] = (self.num_timesteps, time.perf_counter())
                return False
            return time.perf_counter() - marks["start"] < max_seconds

    envs = make_vec_env("CartPole-v1", n_envs=zoo["n_envs"], seed=seed)
    model = PPO(
        "MlpPolicy",
        envs,
        n_steps=zoo["n_steps"],
        batch_size=zoo["batch_size"],
        gae_lambda=zoo["gae_lambda"],
        gamma=zoo["gamma"],
        n_epochs=zoo["n_epochs"],
        ent_coef=zoo["ent_coef"],
        learning_rate=_linear(zoo["learning_rate"]),
        clip_range=_linear(zoo["clip_range"]),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(total_timesteps=min(max_steps, zoo["n_timesteps"]), callback=Solved())
    end = marks["solved"][1] if marks["solved"] else time.perf_counter()
    start = marks["start"]
    seconds = end - start
    steps = model.num_timesteps
    first_steps, first_at = marks["first"] or (steps, end)
    steady = (steps - first_steps) / (end - first_at) if end > first_at else 0.0
    envs.close()
    return {
        "solved_s": seconds if marks["solved"] else None,
        "solved_steps": marks["solved"][0] if marks["solved"] else None,
        "steps": steps,
        "seconds": seconds,
        "steady_sps": steady,
    }
