"""The built-in environment tasks (`--task guess`): a text environment each, its prompts its
reset observations (one seed a group, loading.seeded_rows), and the alphabet a built-in model's
tokenizer needs for its text."""

from __future__ import annotations

from collections.abc import Callable

from nostall.agents.text_env import GUESS_CHARACTERS, GuessNumber

# name -> the environment, given the run's max_turns
ENV_TASKS: dict[str, Callable[[int], object]] = {
    "guess": lambda max_turns: GuessNumber(max_turns=max_turns),
}
ENV_TASK_CHARACTERS: dict[str, list[str]] = {"guess": GUESS_CHARACTERS}
