"""What a PPO / APPO run builds before its first step: the environments (an id through the
backend chooser, or the user's own vector env) and the transport that runs the rollout side in
a thread, a process or on Ray workers (nostall.runtime.transports chooses it by name)."""

from __future__ import annotations

import copy
import functools

import torch

import nostall.envs
from nostall.algos.ppo.agent import ActorCritic, act, native_rollout
from nostall.algos.ppo.config import PPOConfig
from nostall.algos.ppo.policies import make_agent
from nostall.envs.backends import make_env
from nostall.envs.layout import slot_layout
from nostall.runtime.device import pinned
from nostall.runtime.env_side import EnvSide, make_env_side
from nostall.runtime.protocol import Transport
from nostall.runtime.ray.loop import RayOptions
from nostall.runtime.storage import Chunk, rollout_slots
from nostall.runtime.transports import SideRecipe, TransportOptions, open_transport


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

    def beside() -> EnvSide:
        # The rollout side's own copy, on the CPU with the environments. From a GPU trainer this
        # copies the weights to the host once, at construction.
        rollout_agent = copy.deepcopy(agent).cpu()  # sync: one-time copy to the rollout side
        return EnvSide(env, rollout_agent, act, rollout, args.seed, args.seed)

    build_agent = functools.partial(make_agent, hidden=args.hidden, policy=args.policy)
    make_env = functools.partial(make_seeded_env, args)
    anew = functools.partial(
        make_env_side, make_env, build_agent, act, rollout, args.seed, args.num_envs
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
    slots = _slots(args, env, next(agent.parameters()).device)
    return open_transport(args.backend, slots, SideRecipe(beside, anew), agent, options)


def _slots(args: PPOConfig, env, trainer_device: torch.device) -> list[Chunk]:
    layout = slot_layout(env)
    if args.backend == "ray":  # (each worker fills chunks of its own; these receive them)
        return rollout_slots(0, args.num_steps, **layout)
    # Shared memory cannot also be pinned: a trainer on a GPU copies a process's chunks with a
    # host wait (each a few kB); the thread backend pins its chunks instead.
    pin = args.backend == "thread" and pinned(trainer_device)
    return rollout_slots(args.staleness, args.num_steps, **layout, pin_memory=pin)
