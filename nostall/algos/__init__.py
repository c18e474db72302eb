"""Trainers, one readable file each: ppo.py (synchronous PPO) and appo.py (asynchronous PPO
with V-trace)."""
