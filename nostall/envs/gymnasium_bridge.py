"""Moving exact simulator states between nostall and Gymnasium's own environments.

Used to render (Gymnasium draws the frame from our state) and by the oracle tests, which drive
Gymnasium from the same start states as nostall.
"""

import numpy as np


def set_gymnasium_state(env_id: str, unwrapped, state: np.ndarray) -> None:
    """Sets a Gymnasium classic-control env (unwrapped) to nostall's exported `state` row."""
    if env_id == "MountainCarContinuous-v0":
        # Gymnasium stores this state as float64 after reset and float32 after a step.
        dtype = np.float32 if state[2] else np.float64
        unwrapped.state = np.array(state[:2], dtype=dtype)
    elif env_id == "MountainCar-v0":
        unwrapped.state = np.array(state, dtype=np.float64)
    else:
        unwrapped.state = np.array(state, dtype=np.float64)
    if env_id == "CartPole-v1":
        unwrapped.steps_beyond_terminated = None
    if env_id == "Pendulum-v1":
        unwrapped.last_u = None  # as after reset: the frame shows no torque arrow


def gymnasium_observation(env_id: str, unwrapped) -> np.ndarray:
    """The observation Gymnasium would return for its env's current state."""
    if env_id == "Pendulum-v1":
        return unwrapped._get_obs()
    if env_id == "Acrobot-v1":
        return unwrapped._get_ob()
    return np.array(unwrapped.state, dtype=np.float32)
