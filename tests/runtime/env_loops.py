"""Environment transports built from test parts (a failing act, an exploding agent, a tiny
env), through the one factory every algorithm uses, with the side PPO builds
(nostall.algos.ppo.setup.make_transport builds the same from a config)."""

import copy
import dataclasses
import functools

from nostall.algos.ppo.agent import ActorCritic, act
from nostall.envs.layout import slot_layout
from nostall.runtime.env_side import EnvSide, make_env_side
from nostall.runtime.ray.loop import RayOptions
from nostall.runtime.storage import rollout_slots
from nostall.runtime.transports import SideRecipe, TransportOptions, open_transport

RAY_FIELDS = {f.name for f in dataclasses.fields(RayOptions)}


def env_loop(
    backend,
    agent,
    *,
    num_steps,
    env=None,
    make_env=None,
    act_fn=act,
    make_agent=ActorCritic.for_env,
    staleness=0,
    seed=0,
    rollout=None,
    **options,
):
    """`env` is stepped beside the trainer (thread); `make_env(seed)` builds the envs where
    the side runs (a process, each Ray worker). `options`: TransportOptions' and RayOptions'."""
    layout_env = env if env is not None else make_env(seed)
    layout, num_envs = slot_layout(layout_env), layout_env.num_envs
    if env is None:
        layout_env.close()
    count = 0 if backend == "ray" else staleness  # (Ray's workers fill chunks of their own)
    slots = rollout_slots(count, num_steps, **layout)

    def beside():
        return EnvSide(env, copy.deepcopy(agent).cpu(), act_fn, rollout, seed, seed)

    anew = None
    if make_env is not None:
        anew = functools.partial(
            make_env_side, make_env, make_agent, act_fn, rollout, seed, num_envs
        )
    ray = RayOptions(**{k: options.pop(k) for k in list(options) if k in RAY_FIELDS})
    settings = TransportOptions(staleness=staleness, ray=ray, **options)
    return open_transport(backend, slots, SideRecipe(beside, anew), agent, settings)


def cartpole(num_envs: int, seed: int):
    """A native CartPole vector env resetting in the same step (picklable: make_env for a
    process or worker, as functools.partial(cartpole, n))."""
    import nostall.envs

    return nostall.envs.make("CartPole-v1", num_envs, seed=seed, autoreset_mode="SameStep")
