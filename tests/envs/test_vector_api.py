"""nostall's VectorEnv as a Gymnasium vector env: Gymnasium's own checks, wrappers, rendering,
and a hypothesis fuzz of the public API."""

import os
import warnings

import gymnasium as gym
import numpy as np
import pytest
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
