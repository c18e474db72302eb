"""The arithmetic task with a calculator (`--task calc`): the built-in word problem (`7 apples,
buy 5, eat 3. left=`), solved in turns. A turn that is an expression of whole numbers with
`+`, `-` and `*` is a call to the calculator, answered with its value (`=9`); a turn that is a
number alone is the answer, which ends the episode; anything else is answered `?`. The return
is the arithmetic task's reward of the answer: 1 for the right number, and 0.2 for answering
with a number alone (0 where the turns run out without one).

Expressions are evaluated by a small parser of their own (never Python's eval): the model's
text is the environment's input."""

from __future__ import annotations

import random
import re

from nostall.lm.word_problems import word_problem

_EXPRESSION = re.compile(r"\d+([+\-*]\d+)+")
_LONGEST_NUMBER = 12  # digits of an operand (a product of such stays a plain integer)


def evaluate(expression: str) -> int | None:
    """The value of `a op b op c ...` (op in + - *, * before + and -), or None where the text
    is not such an expression."""
    if not _EXPRESSION.fullmatch(expression):
        return None
    numbers = [int(n) for n in re.findall(r"\d+", expression) if len(n) <= _LONGEST_NUMBER]
    operators = re.findall(r"[+\-*]", expression)
    if len(numbers) != len(operators) + 1:
        return None  # (an operand too long to be a number here)
    terms, signs = [numbers[0]], [1]
    for op, number in zip(operators, numbers[1:], strict=True):
        if op == "*":
            terms[-1] *= number
        else:
            terms.append(number)
            signs.append(1 if op == "+" else -1)
    return sum(sign * term for sign, term in zip(signs, terms, strict=True))


class Calculator:
    """The word problem of `seed`, a calculator a turn away (module docstring)."""

    def __init__(self, max_turns: int = 4):
        self.max_turns = max_turns
        self.answer, self.turn = "", 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        problem, self.answer = word_problem(random.Random(seed))
        self.turn = 0
        return problem, {}

    def step(self, action: str):
        self.turn += 1
        text = action.strip()
        out_of_turns = self.turn >= self.max_turns
        if text.isdigit():  # the answer: the arithmetic task's reward
            return "", float(text == self.answer) + 0.2, True, False, {}
        value = evaluate(text)
        observation = "?" if value is None else f"={value}"
        return observation, 0.0, False, out_of_turns, {}


# The characters a built-in model's tokenizer needs: the word problems' and the calculator's.
CALC_CHARACTERS = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789 ,.=+-*?"))
