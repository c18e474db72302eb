"""What a PPO / APPO run builds before its first step: the environments (an id through the
backend chooser, or the user's own vector env) and the runtime that runs the rollout side in a
thread, a process or on Ray workers."""

from __future__ import annotations

import functools

import nostall.envs
from nostall.algos.ppo.agent import ActorCritic, act, native_rollout
from nostall.algos.ppo.config import PPOConfig
from nostall.algos.ppo.policies import make_agent
from nostall.envs.backends import make_env
from nostall.envs.layout import slot_layout
from nostall.runtime.process import ProcessRuntime
from nostall.runtime.ray_runtime import RayRuntime
from nostall.runtime.runner import Runtime


def make_seeded_env(args: PPOConfig, seed: int):
    """The run's environments (a Ray worker's seeded apart from the other workers')."""
    return make_env(
        args.env_id,
        args.num_envs,
        seed=seed,
        backend=args.env_backend,
        frame_stack=args.frame_stack,
    )


def make_run_env(args: PPOConfig):
    return make_seeded_env(args, args.seed)


def make_runtime(args: PPOConfig, env, agent: ActorCritic, own_env: bool = False):
    """The rollout side over `env` for args.backend. `own_env`: the env is the user's object,
    which only the thread backend can step (the others build their envs where they run)."""
    # The native rollout steps native environments in C++; any other env is stepped from Python.
    native = isinstance(env, nostall.envs.VectorEnv)
    rollout = native_rollout if args.native_rollout and native else None
    if args.backend == "thread":
        return Runtime(
            env,
            agent,
            act,
            num_steps=args.num_steps,
            staleness=args.staleness,
            seed=args.seed,
            rollout=rollout,
        )
    if own_env:
        raise ValueError(
            f"backend {args.backend!r} builds its environments where it runs: give "
            "the env as an id (env_id) or use backend 'thread'"
        )
    build_agent = functools.partial(make_agent, hidden=args.hidden, policy=args.policy)
    if args.backend == "ray":
        return RayRuntime(
            functools.partial(make_seeded_env, args),
            build_agent,
            agent,
            act,
            num_workers=args.num_workers,
            num_steps=args.num_steps,
            staleness=args.staleness,
            seed=args.seed,
            rollout=rollout,
            address=args.ray_address,
            cpus_per_worker=args.cpus_per_worker,
            gpus_per_worker=args.gpus_per_worker,
            weights=args.ray_weights,
            **slot_layout(env),
        )
    return ProcessRuntime(
        functools.partial(make_run_env, args),
        build_agent,
        agent,
        act,
        num_steps=args.num_steps,
        staleness=args.staleness,
        seed=args.seed,
        rollout=rollout,
        **slot_layout(env),
    )
