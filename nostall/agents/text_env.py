"""Text environments for language-model RL, in Gymnasium's shape: each assistant turn is the
action, each observation the text the model reads next.

    class MyEnv:
        def reset(self, *, seed=None, options=None) -> tuple[str, dict]: ...
        def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
            ...  # (observation, reward, terminated, truncated, info)

An episode's return is the sum of its rewards. `check_reset` and `check_step` turn what a user's
environment returned into those types or raise EnvError naming what was wrong: a step that
returns garbage ends its episode as failed, never the run.

GuessNumber is the built-in game (`--task guess`): a hidden digit, a guess a turn, "<" or ">"
back until it is found.
"""

from __future__ import annotations

import math
import random


class EnvError(Exception):
    """An environment call that failed, timed out or returned what a step cannot: the episode
    ends as failed (counted), the run goes on."""


def check_reset(value) -> str:
    """reset's observation (a string, or Gymnasium's (observation, info))."""
    if isinstance(value, tuple) and len(value) == 2:
        value = value[0]
    if not isinstance(value, str):
        raise EnvError(f"reset returned {type(value).__name__}, not (observation: str, info)")
    return value


def check_step(value) -> tuple[str | list[int], float, bool, bool, dict]:
    """step's (observation, reward, terminated, truncated, info), checked: the observation text,
    or token ids (an environment that renders its own, as the tool environment does)."""
    if not isinstance(value, tuple) or len(value) != 5:
        raise EnvError(
            f"step returned {type(value).__name__}, not (observation, reward, terminated, "
            "truncated, info)"
        )
    observation, reward, terminated, truncated, info = value
    tokens = isinstance(observation, list) and all(type(t) is int for t in observation)
    if not isinstance(observation, str) and not tokens:
        raise EnvError(f"step's observation is {type(observation).__name__}, not str")
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise EnvError(f"step's reward {reward!r} is not a number") from None
    if not math.isfinite(reward):
        raise EnvError(f"step's reward is {reward}")
    return (
        observation,
        reward,
        bool(terminated),
        bool(truncated),
        info if isinstance(info, dict) else {},
    )


class GuessNumber:
    """Find a hidden digit in 1..`high`: the model writes a guess each turn and reads back "<"
    (the number is smaller), ">" (larger) or "=" (found), or "?" for anything but one digit.
    Found on turn k earns 1 - (k - 1) / max_turns (fewer turns, more); never found, 0."""

    def __init__(self, high: int = 8, max_turns: int = 4):
        if not 1 <= high <= 9:
            raise ValueError(f"GuessNumber: high must be in 1..9 (one digit), got {high}")
        self.high, self.max_turns = high, max_turns
        self.secret, self.turn = 0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.secret = random.Random(seed).randint(1, self.high)
        self.turn = 0
        return f"guess 1-{self.high}:", {}

    def step(self, action: str):
        self.turn += 1
        guess = action.strip()
        if len(guess) != 1 or not guess.isdigit():
            observation, reward = "?", 0.0
        elif int(guess) == self.secret:
            return "=", 1.0 - (self.turn - 1) / self.max_turns, True, False, {}
        else:
            observation, reward = ("<" if self.secret < int(guess) else ">"), 0.0
        return observation, reward, False, self.turn >= self.max_turns, {}


# The characters a built-in model's tokenizer needs for GuessNumber's text.
GUESS_CHARACTERS = sorted(set("0123456789<>=? -:guesx"))
