"""nostall's VectorEnv as a Gymnasium vector env: Gymnasium's own checks, wrappers, rendering,
and a hypothesis fuzz of the public API."""

import os
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.passive_env_checker import check_obs
from hypothesis import given, settings
from hypothesis import strategies as st

import nostall.envs
from nostall.envs.gymnasium_bridge import set_gymnasium_state

ENV_IDS = list(nostall.envs.ENVS)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_passes_gymnasium_observation_and_step_checks(env_id):
    env = nostall.envs.make(env_id, 5, seed=0)
    assert isinstance(env, gym.vector.VectorEnv)
    obs, info = env.reset(seed=1)
    check_obs(obs, env.observation_space, "reset")
    assert isinstance(info, dict)
    for _ in range(50):
        obs, reward, term, trunc, info = env.step(env.action_space.sample())
        check_obs(obs, env.observation_space, "step")
        assert reward.dtype == np.float64 and reward.shape == (5,)
        assert term.dtype == np.bool_ and trunc.dtype == np.bool_
        assert isinstance(info, dict)
    env.close()


def test_gymnasium_episode_statistics_wrapper_works_with_it():
    env = gym.wrappers.vector.RecordEpisodeStatistics(nostall.envs.make("CartPole-v1", 8, seed=0))
    env.reset(seed=0)
    returns = []
    for _ in range(300):
        _, _, _, _, info = env.step(env.action_space.sample())
        if "episode" in info:
            returns.extend(info["episode"]["r"][info["_episode"]])
    assert returns and all(r >= 8 for r in returns)  # random CartPole lasts > 8 steps
    env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_render_draws_what_gymnasium_draws_for_the_same_state(env_id):
    pytest.importorskip("pygame", reason="rendering needs pygame (gymnasium[classic-control])")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = nostall.envs.make(env_id, 2, seed=0, render_mode="rgb_array")
    env.reset()
    env.step(env.action_space.sample())
    frames = env.render()
    reference = gym.make(env_id, render_mode="rgb_array").unwrapped
    reference.reset(seed=0)
    set_gymnasium_state(env_id, reference, env.get_state()[1])
    np.testing.assert_array_equal(frames[1], reference.render())
    assert len(frames) == 2 and frames[0].ndim == 3
    env.close()


ACTION_DTYPES = st.sampled_from(
    [np.int64, np.int32, np.uint8, np.float32, np.float64, np.bool_, np.complex64]
)


@settings(max_examples=200, deadline=None)
@given(
    env_id=st.sampled_from(ENV_IDS),
    num_envs=st.integers(1, 9),
    num_threads=st.integers(1, 3),
    seed=st.integers(0, 2**31),
    shape=st.lists(st.integers(0, 10), min_size=0, max_size=3),
    dtype=ACTION_DTYPES,
    fill=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5)),
)
def test_fuzz_public_api_never_crashes(env_id, num_envs, num_threads, seed, shape, dtype, fill):
    env = nostall.envs.make(env_id, num_envs, num_threads=num_threads, seed=seed)
    env.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # casting NaN or inf to an integer dtype warns
        actions = np.full(shape, fill).astype(dtype)
    try:
        env.step(actions)
    except (TypeError, ValueError, RuntimeError) as e:
        assert str(e)
    # Whatever happened, the environment still works.
    obs, *_ = env.step(env.action_space.sample())
    assert env.observation_space.shape == obs.shape
    env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("autoreset_mode", ["NextStep", "SameStep"])
def test_numpy_step_copies_or_shares_its_buffers_and_matches_the_tensor_step(
    env_id, autoreset_mode
):
    """The NumPy step writes into buffers made once: `copy=True` (default) returns copies that
    later steps leave alone, `copy=False` the buffers themselves; both give the tensor API's
    results, step for step, with the final observations of same-step resets."""
    kw = dict(seed=3, autoreset_mode=autoreset_mode)
    copied = nostall.envs.make(env_id, 4, **kw)
    shared = nostall.envs.make(env_id, 4, copy=False, **kw)
    tensors = nostall.envs.make(env_id, 4, **kw)
    for env in (copied, shared, tensors):
        env.reset(seed=3)
    rng = np.random.default_rng(0)
    space = copied.action_space
    earlier, shared_obs = None, None
    finals = 0
    for _ in range(300):  # long enough for episodes to end (time limits included for some)
        if copied.single_action_space.shape:  # continuous: float64 input, as NumPy draws it
            actions = rng.uniform(space.low, space.high).astype(np.float64)
        else:
            actions = rng.integers(0, copied.single_action_space.n, size=4).tolist()  # a list
        a = copied.step(actions)
        b = shared.step(actions)
        dtype = torch.int64 if isinstance(actions, list) else torch.float32
        want = tensors.torch.step(torch.as_tensor(actions, dtype=dtype))
        for got in (a, b):
            np.testing.assert_array_equal(got[0], want.obs.numpy())
            np.testing.assert_array_equal(got[1], want.reward.numpy())
            np.testing.assert_array_equal(got[2], want.terminated.numpy())
            np.testing.assert_array_equal(got[3], want.truncated.numpy())
        if "final_obs" in a[4]:
            finals += 1
            done = a[4]["_final_obs"]
            for i in np.flatnonzero(done):
                np.testing.assert_array_equal(a[4]["final_obs"][i], want.final_obs[i].numpy())
                np.testing.assert_array_equal(b[4]["final_obs"][i], want.final_obs[i].numpy())
        if earlier is not None:
            assert earlier[0] is not a[0] and not np.shares_memory(earlier[0], a[0])
            assert b[0] is shared_obs  # the same buffer every step
        earlier, shared_obs = a, b[0]
    if autoreset_mode == "SameStep" and env_id in ("CartPole-v1", "Pendulum-v1", "MountainCar-v0"):
        assert finals > 0  # episodes ended (terminations, or the time limit): finals exercised


def test_numpy_step_skips_the_dispatcher_and_still_reports_engine_errors_every_time(
    monkeypatch,
):
    """The NumPy step calls the engine directly (host_step.py), not the op: its errors are the
    engine's, on the second bad call as on the first, and a closed handle is refused."""
    env = nostall.envs.make("CartPole-v1", 4, seed=0)
    env.reset(seed=0)
    env.step(np.zeros(4, dtype=np.int64))
    stepper = env._buffers.host_step
    for bad in (5, -2):  # twice: the path holds no state that one failure could spoil
        with pytest.raises(RuntimeError, match=f"actions must lie in \\[0, 2\\), got {bad}"):
            env.step(np.array([0, 1, bad, 0]))
        assert env.step(np.ones(4, dtype=np.int64))[0].shape == (4, 4)
    calls = []

    class CountingOps:  # torch.ops.nostall, counting env_step_into calls
        def __getattr__(self, name):
            op = getattr(torch.ops.nostall, name)
            return (lambda *a: calls.append(a) or op(*a)) if name == "env_step_into" else op

    monkeypatch.setattr(nostall.envs.vector, "ops", CountingOps())
    env.step(np.zeros(4, dtype=np.int64))  # the usual case: no op call
    env.step(np.zeros(4, dtype=np.int32))  # another integer dtype: copied in, no op call
    assert calls == []
    with pytest.raises(RuntimeError, match="actions must have shape"):
        env.step(np.zeros(3, dtype=np.int64))  # an odd shape: the op says what is wrong
    assert len(calls) == 1
    env.close()
    with pytest.raises(RuntimeError, match="handle"):
        stepper()  # past VectorEnv's own check: the engine refuses a closed handle itself


def test_host_stepper_refuses_tensors_it_cannot_address():
    from nostall.envs.host_step import HostStepper

    env = nostall.envs.make("CartPole-v1", 4, seed=0)
    out = env.torch.empty_step()
    with pytest.raises(ValueError, match="contiguous CPU"):
        HostStepper(env.handle, torch.zeros(4, 2, dtype=torch.int64)[:, 0], tuple(out))
    env.close()
