"""The runtime's declared contracts hold for every implementation: the three transports are
`Transport`s, the environments' and the language model's rollout sides are `Fill`s, and every
transport's state is a `LoopState` (the keys it saves are the dataclass's, and a state round-trips
through it)."""

import functools

import pytest
import torch

import nostall.envs
from nostall.algos.grpo import GRPOCommandConfig, build
from nostall.algos.ppo import PPOConfig
from nostall.algos.ppo.agent import ActorCritic
from nostall.algos.ppo.setup import make_transport
from nostall.runtime.protocol import Fill, LoopState, Transport, fill_chunk
from nostall.runtime.ray.loop import RayLoop
from nostall.runtime.storage import chunk_state


def _env():
    return nostall.envs.make("CartPole-v1", 4, seed=0, autoreset_mode="SameStep")


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_the_env_transports_are_transports_and_their_state_a_loop_state(backend):
    env = _env()
    agent = ActorCritic.for_env(env)
    runtime = make_transport(PPOConfig(num_envs=4, num_steps=8, backend=backend), env, agent)
    assert isinstance(runtime, Transport)
    with runtime:
        slot, _ = runtime.next_chunk()
        runtime.release(slot)
        with runtime.boundary():
            runtime.publish(agent)
            state = runtime.state_dict(chunk_state)
    names = {f for f in LoopState.__dataclass_fields__}
    assert set(state) <= names and set(state) >= names - {"workers", "worker_seq"}
    assert LoopState.from_dict(state).as_dict().keys() == state.keys()
    assert isinstance(LoopState.from_dict(state).version, int)


def test_the_ray_loop_is_a_transport():
    env = _env()
    loop = RayLoop([object(), object()], lambda worker: None, ActorCritic.for_env(env))
    assert isinstance(loop, Transport)


def test_the_rollout_sides_are_fills():
    runtime = make_transport(
        PPOConfig(num_envs=4, num_steps=8), _env(), ActorCritic.for_env(_env())
    )
    assert isinstance(runtime._fill, Fill)  # EnvSide
    setup = build(GRPOCommandConfig(num_prompts=2, num_generations=2, watch_syncs=False))
    assert isinstance(setup.generator, Fill)  # GroupGenerator


def test_fill_chunk_tags_the_chunk_with_the_version_pulled_before_it_began():
    class Side:
        def __init__(self):
            self.model, self.calls = torch.nn.Linear(1, 1), []

        def __call__(self, chunk):
            self.calls.append(chunk.version)  # the chunk is untagged while it is filled

    class Chunk:
        version = -1

    chunk, side = Chunk(), Side()
    ticks = iter([1.0, 2.5])
    version, start, end = fill_chunk(side, chunk, lambda: 7, clock=functools.partial(next, ticks))
    assert (version, start, end, chunk.version, side.calls) == (7, 1.0, 2.5, 7, [-1])


def test_a_loop_state_ignores_no_key_it_does_not_know():
    state = LoopState(1, 0, 2, {}, {}, 1, []).as_dict()
    assert "workers" not in state  # optional fields absent, as a thread checkpoint has them
    with pytest.raises(TypeError):
        LoopState.from_dict({"version": 1})  # a state missing its fields is refused
