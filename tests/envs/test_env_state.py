"""Restoring a Gymnasium environment's state from a checkpoint sets only the data attributes
the environment has, each with a value of its kind: a checkpoint restores state and never adds
an attribute, replaces a method or changes an attribute's kind."""

import copy

import gymnasium as gym
import numpy as np
import pytest

from nostall.envs.env_state import EnvStateError, env_state, load_env_state


def _saved_and_fresh():
    env = gym.make("CartPole-v1")
    env.reset(seed=3)
    env.step(0)
    fresh = gym.make("CartPole-v1")
    fresh.reset(seed=0)
    return env_state(env, "CartPole-v1"), fresh


def _cartpole_link(states):
    return next(s for s in states if s["class"] == "CartPoleEnv")


def test_a_checkpoint_restores_what_the_environment_holds():
    states, fresh = _saved_and_fresh()
    load_env_state(fresh, states, "CartPole-v1")
    assert (
        env_state(fresh, "CartPole-v1")[-1]["attributes"].keys()
        == _cartpole_link(states)["attributes"].keys()
    )


@pytest.mark.parametrize(
    "attribute, value, message",
    [
        ("planted", 1.0, "does not hold as data"),  # an attribute the environment never has
        ("step", 0, "to a int, where the environment holds a function"),  # a method
        ("__class__", "x", "does not hold as data"),
        ("state", "not an array", "to a str, where the environment holds a ndarray"),
        ("gravity", [1, 2], "to a list, where the environment holds a float"),
    ],
)
def test_a_checkpoint_naming_another_attribute_or_kind_is_refused(attribute, value, message):
    states, fresh = _saved_and_fresh()
    forged = copy.deepcopy(states)
    _cartpole_link(forged)["attributes"][attribute] = value
    before = env_state(fresh, "CartPole-v1")
    with pytest.raises(EnvStateError, match=message):
        load_env_state(fresh, forged, "CartPole-v1")
    assert "planted" not in vars(fresh.unwrapped) and callable(fresh.unwrapped.step)
    after = _cartpole_link(env_state(fresh, "CartPole-v1"))["attributes"]
    # Nothing set: the environment is as it was (its state array too).
    assert np.array_equal(
        after["state"]["data"], _cartpole_link(before)["attributes"]["state"]["data"]
    )
