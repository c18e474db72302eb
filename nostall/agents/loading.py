"""A text environment the user names ("module:Class", or a function that returns one), and the
prompt rows it gives: each row's prompt is its reset observation for a seed drawn from the run's
prompt stream, the seed carried in the row's `answer` column, so every episode of a group
resets to the same state."""

from __future__ import annotations

import random
from collections.abc import Callable

from nostall.agents.env_process import HostedEnv
from nostall.agents.text_env import EnvError, check_reset
from nostall.user_code import import_named


def load_environment(spec: str) -> Callable[[], object]:
    """The factory `spec` names, imported (ValueError naming what is wrong)."""
    return import_named(spec, "--environment", "module:Class", "class or function")


def hosted_environment(spec: str) -> HostedEnv:
    """--environment's spec for a process to host (env_isolation="process"): checked for its
    form here, imported there alone (its module's code never runs in the trainer)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--environment {spec!r} must be given as module:Class")
    return HostedEnv(spec)


def seeded_rows(make_env: Callable[[], object], name: str):
    """A prompt generator (PromptSource's `generate`): (reset observation, seed)."""

    def row(rng: random.Random) -> tuple[str, str]:
        seed = rng.randrange(1 << 30)
        env = make_env()
        for method in ("reset", "step"):
            if not callable(getattr(env, method, None)):
                raise ValueError(f"environment {name}: {type(env).__name__} has no {method}()")
        try:
            observation = check_reset(env.reset(seed=seed))
        except EnvError as e:
            raise ValueError(f"environment {name}: {e}") from None
        return observation, str(seed)

    return row
