"""What a PPO / APPO run builds before its first step: the environments (an id through the
backend chooser, or the user's own vector env) and the transport that runs the rollout side in
a thread, a process or on Ray workers (nostall.runtime.transports chooses it by name)."""

from __future__ import annotations

import functools

import nostall.envs
from nostall.algos.ppo.agent import ActorCritic, act, native_rollout
from nostall.algos.ppo.config import PPOConfig
from nostall.algos.ppo.policies import make_agent
from nostall.envs.backends import make_env
from nostall.envs.layout import slot_layout
from nostall.runtime.device import pinned
from nostall.runtime.env_side import env_side_recipe, env_slots
from nostall.runtime.protocol import Transport
from nostall.runtime.ray.loop import RayOptions
from nostall.runtime.transports import TransportOptions, open_transport


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


def make_transport(args: PPOConfig, env, agent: ActorCritic, own_env: bool = False) -> Transport:
    """The rollout side over `env` for args.backend. `own_env`: the env is the user's object,
    which only the thread backend can step (the others build their envs where they run)."""
    if own_env and args.backend != "thread":
        raise ValueError(
            f"backend {args.backend!r} builds its environments where it runs: give "
            "the env as an id (env_id) or use backend 'thread'"
        )
    # The native rollout steps native environments in C++; any other env is stepped from Python.
    native = isinstance(env, nostall.envs.VectorEnv)
    rollout = native_rollout if args.native_rollout and native else None
    build_agent = functools.partial(make_agent, hidden=args.hidden, policy=args.policy)
    seeded = functools.partial(make_seeded_env, args)
    recipe = env_side_recipe(
        agent, act, rollout, args.seed, args.num_envs, env, seeded, build_agent
    )
    options = TransportOptions(
        staleness=args.staleness,
        ray=RayOptions(
            num_workers=args.num_workers,
            address=args.ray_address,
            cpus_per_worker=args.cpus_per_worker,
            gpus_per_worker=args.gpus_per_worker,
            weights=args.ray_weights,
        ),
    )
    pin = pinned(next(agent.parameters()).device)
    slots = env_slots(args.backend, args.staleness, args.num_steps, slot_layout(env), pin)
    return open_transport(args.backend, slots, recipe, agent, options)
