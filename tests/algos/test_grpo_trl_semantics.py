"""GRPO with TRL's semantics where TRL has them: prompts walked once an epoch in a shuffled
order, conversational prompts through the chat template, TRL's option names and options,
TRL's logged metrics, and log-probs of the distribution the sampler drew from. Each test failed
on the code before it."""

import pytest

from nostall.lm.tasks import PromptSource

ROWS = [{"prompt": f"row{i}"} for i in range(10)]


def test_prompts_are_walked_once_an_epoch_in_a_new_order_each_epoch():
    source = PromptSource(rows=ROWS)
    source.seed(3)
    drawn = [row["prompt"] for _ in range(5) for row in source.batch(4)]  # 2 epochs
    first, second = drawn[:10], drawn[10:20]
    assert sorted(first) == sorted(second) == sorted(r["prompt"] for r in ROWS)
    assert first != second  # reshuffled
    assert source.epoch == 2


@pytest.mark.parametrize("k", [1, 3])
def test_the_prompt_stream_resumes_mid_epoch_from_its_state(k):
    source = PromptSource(rows=ROWS)
    source.seed(7)
    for _ in range(k):
        source.batch(3)
    state = source.state_dict()
    rest = [row["prompt"] for _ in range(6) for row in source.batch(3)]
    resumed = PromptSource(rows=ROWS)
    resumed.seed(0)
    resumed.load_state_dict(state)
    assert [row["prompt"] for _ in range(6) for row in resumed.batch(3)] == rest


def test_a_prompt_state_from_another_dataset_is_refused():
    source = PromptSource(rows=ROWS)
    source.batch(2)
    with pytest.raises(ValueError, match="saved with another dataset"):
        PromptSource(rows=ROWS[:3]).load_state_dict(source.state_dict())
