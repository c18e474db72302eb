"""env_rollout (a whole chunk of policy -> sample -> step in one op): against a pure-PyTorch
loop of the same policy (eager nn.Sequential, Gumbel-max or Gaussian written out) stepping the
same environments one step at a time; compile, opcheck, errors, and hypothesis-drawn sizes."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nostall.envs
from nostall.algos.ppo.agent import ActorCritic, native_rollout
from nostall.envs.layout import slot_layout
from nostall.runtime.storage import Chunk

ops = torch.ops.nostall
ENV_IDS = ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0"]


def _setup(env_id, num_envs, T, seed=0, hidden=16):
    """Two identically seeded environments, an agent and a chunk for each."""
    envs = [nostall.envs.make(env_id, num_envs, seed=seed, autoreset_mode="SameStep")]
    envs.append(nostall.envs.make(env_id, num_envs, seed=seed, autoreset_mode="SameStep"))
    torch.manual_seed(seed)
    agent = ActorCritic.for_env(envs[0], hidden)
    with torch.no_grad():  # larger weights than PPO's init, so actions vary
        for p in agent.parameters():
            p.normal_(0.0, 0.7)
    layout = slot_layout(envs[0])
    del layout["num_envs"]
    chunks = [Chunk.empty(T, num_envs, **layout) for _ in envs]
    for env, chunk in zip(envs, chunks, strict=True):
        chunk.obs[0].copy_(env.torch.reset(seed=seed))
    return envs, agent, chunks


def _noise(agent, T, N, seed):
    g = torch.Generator().manual_seed(seed)
    draw = torch.rand if agent.discrete else torch.randn
    return draw(T, N, agent.actor[-1].out_features, generator=g)


def _reference_rollout(env, agent, chunk, noise):
    """The same chunk, one eager step at a time, with no nostall op but the environment step."""
    with torch.no_grad():
        for t in range(chunk.num_steps):
            out = agent.actor(chunk.obs[t])
            chunk.values[t] = agent.critic(chunk.obs[t]).squeeze(-1)
            if agent.discrete:
                gumbel = -torch.log(-torch.log(noise[t].clamp_min(1e-20)))
                action = (out + gumbel).argmax(-1)
                log_p = out.log_softmax(-1).gather(-1, action[:, None]).squeeze(-1)
            else:
                std = agent.log_std.exp()
                action = out + std * noise[t]
                z = (action - out) / std
                log_p = (-0.5 * z**2 - agent.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
            chunk.actions[t], chunk.log_probs[t] = action, log_p
            step = env.torch.step(action)
            chunk.obs[t + 1], chunk.rewards[t] = step.obs, step.reward
            chunk.terminated[t], chunk.truncated[t] = step.terminated, step.truncated
            chunk.final_obs[t] = step.final_obs


def _fused(env, agent, chunk, noise):
    ops.env_rollout(
        env.handle,
        chunk.obs,
        chunk.actions,
        chunk.log_probs,
        chunk.values,
        chunk.rewards,
        chunk.terminated,
        chunk.truncated,
        chunk.final_obs,
        noise,
        [agent.actor[i].weight for i in (0, 2, 4)],
        [agent.actor[i].bias for i in (0, 2, 4)],
        [agent.critic[i].weight for i in (0, 2, 4)],
        [agent.critic[i].bias for i in (0, 2, 4)],
        agent.log_std,
        "tanh",
    )


def _assert_same_chunk(got: Chunk, want: Chunk):
    # Actions, flags and rewards exactly; floats within the policy's float32 rounding (the
    # native tanh is within 2 ulp of torch's). Identical actions make identical environments.
    for name in ("actions", "terminated", "truncated", "rewards", "obs", "final_obs"):
        if name in ("obs", "final_obs") or got.actions.dtype == torch.float32:
            torch.testing.assert_close(
                getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-5
            )
        else:
            assert torch.equal(getattr(got, name), getattr(want, name)), name
    torch.testing.assert_close(got.log_probs, want.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.values, want.values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_matches_an_eager_step_by_step_rollout(env_id):
    T, N = 40, 5
    envs, agent, (got, want) = _setup(env_id, N, T)
    noise = _noise(agent, T, N, seed=1)
    _fused(envs[0], agent, got, noise)
    _reference_rollout(envs[1], agent, want, noise)
    _assert_same_chunk(got, want)
    if agent.discrete:
        assert got.actions.unique().numel() > 1  # the policy really chose
    np.testing.assert_allclose(envs[0].get_state(), envs[1].get_state(), rtol=1e-5, atol=1e-5)


def test_crosses_episode_ends_with_same_step_autoreset():
    T, N = 300, 3  # CartPole episodes of a random-ish policy end well within 300 steps
    envs, agent, (got, want) = _setup("CartPole-v1", N, T)
    noise = _noise(agent, T, N, seed=2)
    _fused(envs[0], agent, got, noise)
    _reference_rollout(envs[1], agent, want, noise)
    assert got.terminated.any()
    _assert_same_chunk(got, want)
    done = got.terminated | got.truncated
    torch.testing.assert_close(got.final_obs[done], want.final_obs[done], rtol=0, atol=0)


def test_chunk_tensors_at_a_storage_offset():
    # Rows of larger buffers (contiguous views at nonzero offsets) are written where they are.
    T, N = 12, 3
    envs, agent, (plain, want) = _setup("CartPole-v1", N, T)
    noise = _noise(agent, T, N, seed=4)
    _reference_rollout(envs[1], agent, want, noise)
    got = Chunk(
        **{k: torch.zeros(2, *v.shape, dtype=v.dtype)[1] for k, v in plain.tensors().items()}
    )
    got.obs[0].copy_(plain.obs[0])
    assert got.obs.storage_offset() > 0
    _fused(envs[0], agent, got, noise)
    _assert_same_chunk(got, want)


def test_native_rollout_draws_its_noise_from_the_generator():
    T, N = 16, 4
    envs, agent, (got, want) = _setup("CartPole-v1", N, T)
    native_rollout(agent, envs[0], got, torch.Generator().manual_seed(7))
    _reference_rollout(envs[1], agent, want, _noise(agent, T, N, seed=7))
    _assert_same_chunk(got, want)


def test_compiled_calls_keep_their_order():
    T, N = 8, 3
    envs, agent, (a, b) = _setup("Acrobot-v1", N, T)
    layout = slot_layout(envs[0])
    del layout["num_envs"]
    a2, b2 = Chunk.empty(T, N, **layout), Chunk.empty(T, N, **layout)
    noise = _noise(agent, T, N, seed=3)

    def two_chunks(env, first, second, noise):
        _fused(env, agent, first, noise)
        second.obs[0].copy_(first.obs[-1])
        _fused(env, agent, second, noise)  # the same noise and weights: must not be merged
        return first.obs.clone(), second.obs.clone()

    # (Each chunk gets its own buffers: reading a buffer between two in-place calls that both
    # write it is miscompiled by inductor in torch 2.13 for any mutating custom op.)
    want = two_chunks(envs[0], a, a2, noise)
    torch._dynamo.reset()
    got = torch.compile(two_chunks, fullgraph=True)(envs[1], b, b2, noise)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert not torch.equal(want[0], want[1])
    np.testing.assert_array_equal(envs[0].get_state(), envs[1].get_state())


def test_opcheck():
    T, N = 4, 2
    envs, agent, (chunk, _) = _setup("Pendulum-v1", N, T)
    args = (
        envs[0].handle,
        chunk.obs,
        chunk.actions,
        chunk.log_probs,
        chunk.values,
        chunk.rewards,
        chunk.terminated,
        chunk.truncated,
        chunk.final_obs,
        _noise(agent, T, N, 0),
        [agent.actor[i].weight.detach() for i in (0, 2, 4)],
        [agent.actor[i].bias.detach() for i in (0, 2, 4)],
        [agent.critic[i].weight.detach() for i in (0, 2, 4)],
        [agent.critic[i].bias.detach() for i in (0, 2, 4)],
        agent.log_std.detach(),
        "tanh",
    )
    # As for env_step: re-running a stateful op advances the environment, so the AOT dispatch
    # check (which compares two runs) cannot hold by design.
    torch.library.opcheck(
        ops.env_rollout.default,
        args,
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def _drop_last_actor_layer(k):
    k.update(actor_weights=k["actor_weights"][:2], actor_biases=k["actor_biases"][:2])


def _critic_is_the_actor(k):
    k.update(critic_weights=k["actor_weights"], critic_biases=k["actor_biases"])


def _double_actor_weights(k):
    k.update(actor_weights=[w.double() for w in k["actor_weights"]])


def _bad_cases():
    """(mutation of the fused call's keyword arguments, expected message)."""
    return [
        (lambda k: k.update(obs=k["obs"][:, :, :3]), "obs must be Float of shape \\[6, 2, 4\\]"),
        (lambda k: k.update(obs=k["obs"].double()), "obs must be Float"),
        (lambda k: k.update(actions=k["actions"].int()), "actions must be Long"),
        (lambda k: k.update(log_probs=k["log_probs"][:, :1]), "log_probs must be Float of shape"),
        (lambda k: k.update(rewards=k["rewards"].float()), "rewards must be Double"),
        (lambda k: k.update(terminated=k["terminated"].int()), "terminated must be Bool"),
        (lambda k: k.update(noise=k["noise"][:, :, :1]), "noise must be Float of shape"),
        (lambda k: k.update(values=k["values"].t().contiguous().t()), "values must be contiguous"),
        (_drop_last_actor_layer, "actor's output width must be 2"),
        (_critic_is_the_actor, "critic's output width must be 1"),
        (lambda k: k.update(actor_biases=k["actor_biases"][:2]), "biases must have one tensor"),
        (lambda k: k.update(log_std=torch.zeros(2)), "log_std must be None"),
        (lambda k: k.update(activation="gelu"), "activation must be 'tanh' or 'relu'"),
        (_double_actor_weights, "must have the dtype of input"),
    ]


def _call_kwargs(env, agent, chunk, noise):
    return dict(
        obs=chunk.obs,
        actions=chunk.actions,
        log_probs=chunk.log_probs,
        values=chunk.values,
        rewards=chunk.rewards,
        terminated=chunk.terminated,
        truncated=chunk.truncated,
        final_obs=chunk.final_obs,
        noise=noise,
        actor_weights=[agent.actor[i].weight.detach() for i in (0, 2, 4)],
        actor_biases=[agent.actor[i].bias.detach() for i in (0, 2, 4)],
        critic_weights=[agent.critic[i].weight.detach() for i in (0, 2, 4)],
        critic_biases=[agent.critic[i].bias.detach() for i in (0, 2, 4)],
        log_std=None,
        activation="tanh",
    )


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_arguments_are_named(case):
    T, N = 5, 2
    envs, agent, (chunk, _) = _setup("CartPole-v1", N, T)
    kwargs = _call_kwargs(envs[0], agent, chunk, _noise(agent, T, N, 0))
    mutate, message = _bad_cases()[case]
    mutate(kwargs)
    with pytest.raises(RuntimeError, match=message):
        ops.env_rollout(envs[0].handle, *kwargs.values())


def test_continuous_needs_log_std_and_a_closed_env_says_so():
    T, N = 3, 2
    envs, agent, (chunk, _) = _setup("Pendulum-v1", N, T)
    kwargs = _call_kwargs(envs[0], agent, chunk, _noise(agent, T, N, 0))
    with pytest.raises(RuntimeError, match=r"log_std .* is required for continuous"):
        ops.env_rollout(envs[0].handle, *kwargs.values())
    kwargs["log_std"] = agent.log_std.detach()
    ops.env_rollout(envs[0].handle, *kwargs.values())
    envs[0].close()
    with pytest.raises(RuntimeError, match="closed"):
        ops.env_rollout(envs[0].handle, *kwargs.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
def test_cuda_tensors_get_a_clear_error():
    T, N = 3, 2
    envs, agent, (chunk, _) = _setup("CartPole-v1", N, T)
    kwargs = _call_kwargs(envs[0], agent, chunk, _noise(agent, T, N, 0))
    kwargs["actor_weights"] = [w.cuda() for w in kwargs["actor_weights"]]
    with pytest.raises(RuntimeError, match="env_rollout runs the environments and the policy"):
        ops.env_rollout(envs[0].handle, *kwargs.values())


@settings(max_examples=15, deadline=None)
@given(
    env_id=st.sampled_from(ENV_IDS),
    num_envs=st.integers(1, 6),
    T=st.integers(1, 30),
    hidden=st.integers(1, 20),
    seed=st.integers(0, 2**16),
)
def test_any_size_matches_the_eager_rollout(env_id, num_envs, T, hidden, seed):
    envs, agent, (got, want) = _setup(env_id, num_envs, T, seed=seed, hidden=hidden)
    noise = _noise(agent, T, num_envs, seed)
    _fused(envs[0], agent, got, noise)
    _reference_rollout(envs[1], agent, want, noise)
    _assert_same_chunk(got, want)
