"""The algorithms, one package each, readable top to bottom: ppo/ (synchronous PPO with GAE),
appo/ (asynchronous PPO with V-trace: PPO's package with other targets), grpo/ (GRPO for causal
language models). Each gives the shared training loop (nostall/train/loop.py) its hooks."""
