"""Bad input to the environments: a clear error, and a healthy environment afterwards."""

import gc
import os
import time

import numpy as np
import pytest
import torch

import nostall.envs

ops = torch.ops.nostall


def _healthy(env) -> None:
    """One more step works and gives well-formed output."""
    obs, reward, *_ = env.step(env.action_space.sample())
    assert obs.shape == env.observation_space.shape
    assert np.isfinite(obs).all() and reward.shape == (env.num_envs,)


@pytest.fixture
def cartpole():
    env = nostall.envs.make("CartPole-v1", 4, seed=0)
    env.reset()
    yield env
    env.close()


@pytest.fixture
def pendulum():
    env = nostall.envs.make("Pendulum-v1", 4, seed=0)
    env.reset()
    yield env
    env.close()


@pytest.mark.parametrize(
    "actions,error,message",
    [
        (np.zeros(3, dtype=np.int64), RuntimeError, "actions must have shape \\[4\\]"),
        (np.zeros((4, 1), dtype=np.int64), RuntimeError, "actions must have shape \\[4\\]"),
        (np.zeros(4, dtype=np.float32), TypeError, "actions must be integers"),
        (np.array([0, 1, 2, 0]), RuntimeError, "actions must lie in \\[0, 2\\), got 2 at index 2"),
        (np.array([0, -1, 0, 0]), RuntimeError, "actions must lie in \\[0, 2\\), got -1"),
    ],
)
def test_bad_discrete_actions(cartpole, actions, error, message):
    before = cartpole.get_state()
    with pytest.raises(error, match=message):
        cartpole.step(actions)
    np.testing.assert_array_equal(cartpole.get_state(), before)  # no env moved
    _healthy(cartpole)


@pytest.mark.parametrize(
    "actions,error,message",
    [
        (np.zeros((4, 2), dtype=np.float32), RuntimeError, "actions must have shape \\[4, 1\\]"),
        (np.zeros(4, dtype=np.float32), RuntimeError, "actions must have shape \\[4, 1\\]"),
        (np.zeros((4, 1), dtype=np.int64), TypeError, "actions must be floats"),
        (np.array([[0.0], [np.nan], [0.0], [0.0]], np.float32), RuntimeError, "must not be NaN"),
    ],
)
def test_bad_continuous_actions(pendulum, actions, error, message):
    before = pendulum.get_state()
    with pytest.raises(error, match=message):
        pendulum.step(actions)
    np.testing.assert_array_equal(pendulum.get_state(), before)
    _healthy(pendulum)


def test_torch_api_is_strict_about_dtype(cartpole, pendulum):
    with pytest.raises(RuntimeError, match="actions must be int64"):
        cartpole.torch.step(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="actions must be float32"):
        ops.env_step(pendulum.handle, torch.zeros(4, 1, dtype=torch.float64))
    _healthy(cartpole)
    _healthy(pendulum)


def test_closed_and_unknown_handles():
    env = nostall.envs.make("CartPole-v1", 2)
    handle = env.handle
    env.close()
    env.close()  # twice is fine
    with pytest.raises(RuntimeError, match="the environment is closed"):
        env.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(RuntimeError, match=f"handle {handle} is closed or was never opened"):
        ops.env_step(handle, torch.zeros(2, dtype=torch.long))
    with pytest.raises(RuntimeError, match="handle 987654 is closed or was never opened"):
        ops.env_reset(987654, -1)


def test_recv_with_nothing_sent(cartpole):
    with pytest.raises(RuntimeError, match="recv\\(\\) needs 4 sent steps, but only 0"):
        cartpole.recv()
    cartpole.send(np.zeros(2, dtype=np.int64), [0, 1])
    with pytest.raises(RuntimeError, match="only 2 are outstanding"):
        cartpole.recv()
    with pytest.raises(RuntimeError, match="step\\(\\) while asynchronous steps are outstanding"):
        cartpole.step(np.zeros(4, dtype=np.int64))
    with pytest.raises(RuntimeError, match="env 0 was sent an action and has not been received"):
        cartpole.send(np.zeros(1, dtype=np.int64), [0])
    cartpole.send(np.zeros(2, dtype=np.int64), [2, 3])
    cartpole.recv()
    _healthy(cartpole)


def test_send_rejects_bad_env_ids(cartpole):
    with pytest.raises(RuntimeError, match="env_ids must lie in \\[0, 4\\), got 9"):
        cartpole.send(np.zeros(1, dtype=np.int64), [9])
    with pytest.raises(RuntimeError, match="env_ids lists env 1 twice"):
        cartpole.send(np.zeros(2, dtype=np.int64), [1, 1])
    _healthy(cartpole)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(num_threads=0), "num_threads must lie in \\[1, 256\\], got 0"),
        (dict(num_threads=100000), "num_threads must lie in \\[1, 256\\], got 100000"),
        (dict(num_envs=0), "num_envs must be at least 1"),
        (dict(batch_size=9), "batch_size must lie in \\[1, 4\\], got 9"),
        (dict(seed=-1), "seed must be non-negative"),
    ],
)
def test_bad_construction_arguments(kwargs, message):
    args = dict(num_envs=4) | kwargs
    with pytest.raises(RuntimeError, match=message):
        nostall.envs.make("CartPole-v1", **args)


@pytest.mark.parametrize("steps", [0, -3, -1])
def test_a_bad_time_limit_is_refused_not_replaced(steps):
    with pytest.raises(ValueError, match=f"max_episode_steps must be at least 1, got {steps}"):
        nostall.envs.make("CartPole-v1", 2, max_episode_steps=steps)
    with pytest.raises(RuntimeError, match="max_episode_steps must be at least 1"):
        ops.env_create("CartPole-v1", 2, 1, 0, 0, -1, -3)


def test_negative_and_non_integer_reset_seeds_and_env_ids(cartpole):
    for seed in (-7, 1.5, True):
        with pytest.raises(ValueError, match="seed must be a non-negative integer"):
            cartpole.reset(seed=seed)
    with pytest.raises(RuntimeError, match="seed must be non-negative"):
        ops.env_reset(cartpole.handle, -7)
    with pytest.raises(TypeError, match="env_ids must be integers"):
        cartpole.send(np.zeros(2, dtype=np.int64), [0.0, 1.7])
    _healthy(cartpole)


def test_aliased_step_outputs_are_refused(cartpole):
    from nostall.envs import EnvStep

    n = cartpole.num_envs
    flags = torch.zeros(n, dtype=torch.bool)
    rows = EnvStep(
        torch.zeros(n, 4), torch.zeros(n, dtype=torch.float64), flags, flags, torch.zeros(0, 4)
    )
    cartpole.torch.reset()
    with pytest.raises(RuntimeError, match="terminated and truncated must not share memory"):
        cartpole.torch.step(torch.zeros(n, dtype=torch.long), out=rows)


def test_a_damaged_loaded_state_is_refused_whole(cartpole):
    cartpole.reset(seed=0)
    good = cartpole.state_dict()
    for edit, message in [
        (lambda w: w.view(cartpole.num_envs, -1)[:, 4].fill_(2**63 - 1), "step count"),
        (lambda w: w.view(cartpole.num_envs, -1)[:, 5].fill_(7), "reset flag 7"),
        (lambda w: w.view(cartpole.num_envs, -1)[:, :4].zero_(), "all-zero generator state"),
        (
            lambda w: w.view(cartpole.num_envs, -1)[1, 6:].view(torch.float64).fill_(float("nan")),
            "is not finite",
        ),
    ]:
        bad = {**good, "words": good["words"].clone()}
        edit(bad["words"])
        with pytest.raises(RuntimeError, match=message):
            cartpole.load_state_dict(bad)
    cartpole.load_state_dict(good)  # unchanged by the refused loads
    _healthy(cartpole)


def test_unknown_environment_id():
    with pytest.raises(ValueError, match="unknown environment id 'CartPole-v0'; known ids: "):
        nostall.envs.make("CartPole-v0", 2)
    with pytest.raises(RuntimeError, match="unknown environment id 'Nope'"):
        ops.env_create("Nope", 1, 1, 0, 0, -1, -1)


def test_unsupported_autoreset_mode_and_render_mode():
    with pytest.raises(ValueError, match="autoreset_mode must be one of"):
        nostall.envs.make("CartPole-v1", 2, autoreset_mode="Disabled")
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array'"):
        nostall.envs.make("CartPole-v1", 2, render_mode="human")


def _thread_count() -> int:
    """The environment engine's worker threads (named nostall-env) alive in this process: other
    threads (a sanitizer's, a thread pool started lazily) come and go on their own."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().strip() == "nostall-env"
        except OSError:  # the thread ended while being listed
            pass
    return count


def _threads_back_to(count: int, timeout_s: float = 1.0) -> bool:
    """True once no more than `count` worker threads are listed. A thread that pthread_join has
    returned for may stay listed in /proc for a moment while the kernel finishes its exit, so
    the count is polled, not read once."""
    deadline = time.monotonic() + timeout_s
    while _thread_count() > count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_collected_environment_is_freed_with_its_threads():
    gc.collect()
    before = _thread_count()
    env = nostall.envs.make("CartPole-v1", 256, num_threads=4)
    handle = env.handle
    env.reset()
    env.step(np.zeros(256, dtype=np.int64))
    assert _thread_count() >= before + 3  # the worker threads exist while the env lives
    del env
    gc.collect()
    assert _threads_back_to(before), _thread_count()
    with pytest.raises(RuntimeError, match="closed or was never opened"):
        ops.env_step(handle, torch.zeros(256, dtype=torch.long))


def test_close_joins_threads_even_with_steps_in_flight():
    before = _thread_count()
    env = nostall.envs.make("Acrobot-v1", 64, num_threads=3, batch_size=8)
    env.reset()
    env.send(np.zeros(64, dtype=np.int64))
    env.close()
    assert _threads_back_to(before), _thread_count()
