"""Stable-Baselines3 PPO on CartPole-v1 as its users run it (the RL Zoo's tuned settings), for
`nostall profile` (tests/profiler/test_real_code.py). Argument: total timesteps."""

import sys

from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 512
env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
model = PPO(
    "MlpPolicy",
    env,
    n_steps=32,
    batch_size=256,
    n_epochs=20,
    gae_lambda=0.8,
    gamma=0.98,
    ent_coef=0.0,
    learning_rate=1e-3,
    clip_range=0.2,
    seed=0,
    device="cpu",
)
model.learn(total_timesteps=steps)
