"""Environment transports built from test parts (a failing act, an exploding agent, a tiny
env), through the one factory every algorithm uses, with the side and chunks PPO builds
(nostall.algos.ppo.setup.make_transport builds the same from a config)."""

import dataclasses

from nostall.algos.ppo.agent import ActorCritic, act
from nostall.envs.layout import slot_layout
from nostall.runtime.env_side import env_side_recipe, env_slots
from nostall.runtime.ray.loop import RayOptions
from nostall.runtime.transports import TransportOptions, open_transport

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
    layout = slot_layout(layout_env)
    if env is None:
        layout_env.close()
    slots = env_slots(backend, staleness, num_steps, layout, pin=False)
    recipe = env_side_recipe(
        agent, act_fn, rollout, seed, layout["num_envs"], env, make_env, make_agent
    )
    ray = RayOptions(**{k: options.pop(k) for k in list(options) if k in RAY_FIELDS})
    settings = TransportOptions(staleness=staleness, ray=ray, **options)
    return open_transport(backend, slots, recipe, agent, settings)


def cartpole(num_envs: int, seed: int):
    """A native CartPole vector env resetting in the same step (picklable: make_env for a
    process or worker, as functools.partial(cartpole, n))."""
    import nostall.envs

    return nostall.envs.make("CartPole-v1", num_envs, seed=seed, autoreset_mode="SameStep")
