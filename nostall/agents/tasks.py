"""The built-in environment tasks (`--task guess`, `--task calc`): a text environment each, its
prompts its reset observations (one seed a group, loading.seeded_rows), and the alphabet a
built-in model's tokenizer needs for its text."""

from __future__ import annotations

from collections.abc import Callable

from nostall.agents import calculator, text_env
from nostall.agents.calculator import CALC_CHARACTERS, Calculator
from nostall.agents.env_process import HostedEnv
from nostall.agents.text_env import GUESS_CHARACTERS, GuessNumber

# name -> the environment, given the run's max_turns
ENV_TASKS: dict[str, Callable[[int], object]] = {
    "guess": lambda max_turns: GuessNumber(max_turns=max_turns),
    "calc": lambda max_turns: Calculator(max_turns=max_turns),
}
ENV_TASK_CHARACTERS: dict[str, list[str]] = {"guess": GUESS_CHARACTERS, "calc": CALC_CHARACTERS}
# name -> the environment as a process hosts it (env_isolation="process"), given max_turns:
# its module loaded by file (the host imports neither torch nor nostall)
HOSTED_TASKS: dict[str, Callable[[int], HostedEnv]] = {
    "guess": lambda max_turns: HostedEnv(
        f"{text_env.__file__}:GuessNumber", {"max_turns": max_turns}
    ),
    "calc": lambda max_turns: HostedEnv(
        f"{calculator.__file__}:Calculator", {"max_turns": max_turns}
    ),
}
