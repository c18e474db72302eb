"""The built-in reasoning task: two-step arithmetic word problems, rewarded for the right
number and for answering with a number alone; the built-in model reads them with a tokenizer of
the task's alphabet, and its reward rises."""

import random

from nostall.algos import grpo
from nostall.lm.tasks import TASKS, digits_format_reward, number_reward


def test_word_problems_have_their_answers():
    rng = random.Random(0)
    for _ in range(200):
        prompt, answer = TASKS["arithmetic"](rng)
        numbers = [int(w.strip(",.")) for w in prompt.split() if w.strip(",.").isdigit()]
        assert prompt.endswith("left=") and len(numbers) == 3
        assert int(answer) == numbers[0] + numbers[1] - numbers[2] >= 0
    assert number_reward([], [" 9", "9 ", "10", "x"], ["9"] * 4) == [1.0, 1.0, 0.0, 0.0]
    assert digits_format_reward([], ["12", " 3", "1a", ""]) == [1.0, 1.0, 0.0, 0.0]


def test_the_reward_rises_on_the_tiny_model():
    args = grpo.GRPOCommandConfig(
        task="arithmetic", steps=100, seed=3, max_new_tokens=3, watch_syncs=False
    )
    trainer = grpo.GRPOTrainer(args=args)
    assert trainer.setup.reward_names == ["number_reward", "digits_format_reward"]
    rewards = trainer.train().rewards
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.1, (first, last)
