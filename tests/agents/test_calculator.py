"""The arithmetic task with a calculator (`--task calc`): expressions evaluated by a parser of
its own (never Python's eval), a turn that is an expression answered with its value, a number
alone the answer scored as the arithmetic task scores it, anything else answered `?`; reached
from the command line and from Python, in threads and in processes, and learned by the tiny
model."""

import dataclasses
import random

import pytest

from nostall.agents.calculator import Calculator, evaluate
from nostall.algos import grpo
from nostall.lm.tasks import word_problem


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("7+5-3", 9),
        ("2*3+4", 10),
        ("10-2*3", 4),
        ("3-8", -5),
        ("12*12*12", 1728),
        ("5", None),  # (a number alone is an answer, not a calculation)
        ("7+", None),
        ("+7", None),
        ("7 + 5", None),
        ("2**8", None),
        ("__import__('os').getpid()", None),
        ("1" * 13 + "+1", None),  # (an operand past 12 digits)
        ("", None),
    ],
)
def test_expressions_are_evaluated_by_a_parser_of_their_own(text, value):
    assert evaluate(text) == value


def test_a_turn_calls_the_calculator_or_answers():
    env = Calculator(max_turns=3)
    problem, _ = env.reset(seed=7)
    expected_problem, answer = word_problem(random.Random(7))
    assert problem == expected_problem
    numbers = [int(n) for n in problem.replace(",", " ").replace(".", " ").split() if n.isdigit()]
    expression = f"{numbers[0]}+{numbers[1]}-{numbers[2]}"
    assert env.step(expression) == (f"={answer}", 0.0, False, False, {})
    assert env.step("buy") == ("?", 0.0, False, False, {})
    assert env.step(f" {answer} ") == ("", 1.2, True, False, {})  # (right, and a number alone)
    env.reset(seed=7)
    wrong = str(int(answer) + 1)
    assert env.step(wrong)[1:3] == (0.2, True)  # (a number alone, the wrong one)
    env.reset(seed=7)
    assert env.step("?")[3] is False and env.step("?")[3] is False
    assert env.step("?")[3] is True  # (out of turns: truncated, no answer, no reward)


def test_the_calc_task_runs_from_the_command_line(tmp_path):
    from nostall.cli import main

    main(["train", "grpo", "--task", "calc", "--steps", "2", "--num-prompts", "2",
          "--num-generations", "2", "--no-progress", "--out", str(tmp_path)])  # fmt: skip
    assert (tmp_path / "report.json").is_file()


def test_the_calc_task_in_processes_of_its_own_trains_as_in_threads():
    args = grpo.GRPOCommandConfig(
        task="calc", steps=2, num_prompts=2, num_generations=2, watch_syncs=False, staleness=0
    )
    threads = grpo.train(args)
    processes = grpo.train(dataclasses.replace(args, env_isolation="process"))
    assert processes.rewards == threads.rewards


def test_the_tiny_models_reward_rises_on_the_calc_task():
    """(Measured over seeds 1, 2, 3, 5: 0.02-0.03 over the first 20 steps, 0.23-0.24 over the
    last 30 of 150: the number-alone format first, then some right answers.)"""
    args = grpo.GRPOCommandConfig(task="calc", steps=150, seed=5, watch_syncs=False)
    rewards = grpo.train(args).rewards
    first, last = sum(rewards[:20]) / 20, sum(rewards[-30:]) / 30
    assert last > first + 0.05, (first, last)
