"""The arithmetic task's word problems, with nothing but the standard library: the task
(tasks.py) and the calculator environment (nostall/agents/calculator.py), which a process of its
own loads without torch, draw them alike."""

from __future__ import annotations

import random


def word_problem(rng: random.Random) -> tuple[str, str]:
    """A two-step arithmetic word problem and its answer: `7 apples, buy 5, eat 3. left=` ->
    `9` (never below zero)."""
    item = rng.choice(["apples", "pears", "cakes", "coins", "books"])
    have, gain = rng.randint(1, 9), rng.randint(1, 9)
    lose = rng.randint(0, min(9, have + gain))
    verbs = {
        "apples": ("buy", "eat"),
        "pears": ("pick", "eat"),
        "cakes": ("bake", "sell"),
        "coins": ("find", "spend"),
        "books": ("get", "lend"),
    }[item]
    return f"{have} {item}, {verbs[0]} {gain}, {verbs[1]} {lose}. left=", str(have + gain - lose)
