"""Built-in verifiable tasks for language-model RL, each a prompt generator and a
partial-credit reward (the share of positions that match the answer, over the longer of
completion and answer):
- `copy`: 5 letters from a-h then `=` (`efffb=`); the answer is the same letters (`efffb`);
- `reverse`: the letters reversed;
- `sort`: the letters sorted;
- `sum`: 4 digits then `=` (`3746=`); the answer is their sum in decimal (`20`);
- `arithmetic`: a two-step word problem (`7 apples, buy 5, eat 3. left=` -> `9`), rewarded for
  the right number (1) and for answering with a number alone (0.2); the built-in models read it
  with a tokenizer of its own alphabet (a-z, 0-9, space and `,.=`).
Prompts from a dataset: prompt_source.py; reward functions and their weighted sum: rewards.py.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable

from nostall.lm.prompt_source import PromptSource, completion_text
from nostall.lm.rewards import RewardFn
from nostall.lm.word_problems import word_problem

LETTERS = "abcdefgh"


def partial_credit(completion: str, answer: str) -> float:
    """Positions where completion and answer agree, over the longer of the two."""
    longest = max(len(completion), len(answer))
    if longest == 0:
        return 0.0
    return sum(a == b for a, b in zip(completion, answer, strict=False)) / longest


def answer_reward(
    prompts: list[str], completions: list[str], answer: list[str], **_
) -> list[float]:
    """Partial credit against each row's `answer` column (the built-in tasks' reward); text or
    conversational completions."""
    return [partial_credit(completion_text(c), a) for c, a in zip(completions, answer, strict=True)]


def _letters(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(n))


def _digits(rng: random.Random, n: int = 4) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def number_reward(prompts: list, completions: list, answer: list[str], **_) -> list[float]:
    """1 where the completion is the answer (surrounding spaces aside), else 0."""
    return [
        float(completion_text(c).strip() == a) for c, a in zip(completions, answer, strict=True)
    ]


def digits_format_reward(prompts: list, completions: list, **_) -> list[float]:
    """1 where the completion is a number alone (the format an answer is read in), else 0."""
    return [float(completion_text(c).strip().isdigit()) for c in completions]


TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "copy": lambda rng: (lambda s: (s + "=", s))(_letters(rng)),
    "reverse": lambda rng: (lambda s: (s + "=", s[::-1]))(_letters(rng)),
    "sort": lambda rng: (lambda s: (s + "=", "".join(sorted(s))))(_letters(rng)),
    "sum": lambda rng: (lambda s: (s + "=", str(sum(map(int, s)))))(_digits(rng)),
    "arithmetic": word_problem,
}
# A task's own rewards and weights (the others: partial credit against the answer).
TASK_REWARDS: dict[str, tuple[list[RewardFn], list[float]]] = {
    "arithmetic": ([number_reward, digits_format_reward], [1.0, 0.2]),
}
# The alphabet a built-in model's tokenizer needs for a task (the others: a-h, 0-9, =).
TASK_CHARACTERS: dict[str, list[str]] = {
    "arithmetic": sorted(set(string.ascii_lowercase + string.digits + " ,.=")),
}


def task_source(name: str) -> PromptSource:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; built-in tasks: {', '.join(TASKS)}")
    return PromptSource(rows=[], generate=TASKS[name])
