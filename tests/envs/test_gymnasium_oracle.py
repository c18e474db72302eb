"""Every native environment against Gymnasium itself, step for step.

Both sides are driven with the same actions. nostall draws its own start states (from the
documented ranges, with its own generator), so whenever an episode starts the Gymnasium env is
set to nostall's exact start state; from there on, observations, rewards, terminated and
truncated flags, time limits and autoreset must agree exactly (tolerance: zero; the dynamics
repeat Gymnasium's float arithmetic operation by operation).
"""

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import nostall.envs
from nostall.envs.gymnasium_bridge import gymnasium_observation, set_gymnasium_state

ENV_IDS = list(nostall.envs.ENVS)
NUM_ENVS = 50
STEPS = 2000  # 50 envs x 2000 steps = 10^5 random-action steps per environment and mode


def _actions(rng: np.random.Generator, info, n: int) -> np.ndarray:
    if info.discrete:
        return rng.integers(0, info.action_space.n, size=n)
    # Beyond the bounds on purpose: both sides must clip the same way.
    high = float(info.action_space.high[0]) * 1.5
    return rng.uniform(-high, high, size=(n, 1)).astype(np.float32)


def _sync_start_states(env_id, ours, theirs, obs, rows) -> None:
    """Sets Gymnasium's envs in `rows` to our state and rewrites their rows of `obs`."""
    state = ours.get_state()
    for i in rows:
        unwrapped = theirs.envs[i].unwrapped
        set_gymnasium_state(env_id, unwrapped, state[i])
        obs[i] = gymnasium_observation(env_id, unwrapped)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_matches_gymnasium_step_for_step(env_id, mode):
    info = nostall.envs.env_info(env_id)
    seed = ENV_IDS.index(env_id) * 7 + (mode == AutoresetMode.SAME_STEP)
    ours = nostall.envs.make(env_id, NUM_ENVS, seed=seed, autoreset_mode=mode)
    theirs = gym.make_vec(
        env_id, NUM_ENVS, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode}
    )
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Gymnasium's checker warns about out-of-bound actions
        our_obs, _ = ours.reset(seed=seed)
        their_obs, _ = theirs.reset(seed=seed)
        _sync_start_states(env_id, ours, theirs, their_obs, range(NUM_ENVS))
        np.testing.assert_array_equal(our_obs, their_obs)
        prev_done = np.zeros(NUM_ENVS, dtype=bool)
        episodes = 0
        for t in range(STEPS):
            actions = _actions(rng, info, NUM_ENVS)
            obs, reward, term, trunc, infos = ours.step(actions)
            g_obs, g_reward, g_term, g_trunc, g_infos = theirs.step(actions)
            done = term | trunc
            if mode == AutoresetMode.NEXT_STEP:
                _sync_start_states(env_id, ours, theirs, g_obs, np.flatnonzero(prev_done))
            else:
                for i in np.flatnonzero(done):
                    np.testing.assert_array_equal(
                        infos["final_obs"][i], g_infos["final_obs"][i], err_msg=f"t={t} i={i}"
                    )
                np.testing.assert_array_equal(infos.get("_final_obs", done), done)
                _sync_start_states(env_id, ours, theirs, g_obs, np.flatnonzero(done))
            np.testing.assert_array_equal(obs, g_obs, err_msg=f"obs at t={t}")
            np.testing.assert_array_equal(reward, g_reward, err_msg=f"reward at t={t}")
            np.testing.assert_array_equal(term, g_term, err_msg=f"terminated at t={t}")
            np.testing.assert_array_equal(trunc, g_trunc, err_msg=f"truncated at t={t}")
            episodes += int(done.sum())
            prev_done = done
    assert episodes > 0, "no episode ended: the test saw no time limit or termination"
    ours.close()
    theirs.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_spaces_and_time_limits_match_gymnasium(env_id):
    theirs = gym.make(env_id)
    info = nostall.envs.env_info(env_id)
    assert info.observation_space == theirs.observation_space
    assert info.action_space == theirs.action_space
    assert info.max_episode_steps == theirs.spec.max_episode_steps
    assert info.reward_threshold == theirs.spec.reward_threshold
    theirs.close()
