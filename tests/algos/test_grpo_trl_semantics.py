"""GRPO with TRL's semantics where TRL has them: prompts walked once an epoch in a shuffled
order, conversational prompts through the chat template, TRL's option names and options,
TRL's logged metrics, and log-probs of the distribution the sampler drew from. Each test failed
on the code before it."""

import pytest
import torch

from nostall.algos import grpo
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


@pytest.mark.parametrize("truncation", [{"top_k": 3}, {"top_p": 0.7}, {}])
def test_with_identical_weights_the_behaviour_weight_is_one_under_top_k_and_top_p(truncation):
    """The generator's behaviour log-probs and the trainer's, from the same weights, agree
    token for token: the decoupled weight exp(trainer - behaviour) is 1 (before, under top-k
    or top-p it was the kept probability mass, about 0.78 at these settings)."""
    args = grpo.GRPOConfig(num_prompts=4, num_generations=4, watch_syncs=False,
                           max_new_tokens=6, **truncation)  # fmt: skip
    setup = grpo.build(args)
    batch = setup.loop.slots[0]
    setup.generator(batch)
    with torch.no_grad():
        trainer = grpo.policy_log_probs(setup.decoder, batch, args.temperature, setup.vocab,
                                        args.num_generations)  # fmt: skip
    mask = batch.completion_mask
    weight = (trainer - batch.log_probs).exp()[mask]
    torch.testing.assert_close(weight, torch.ones_like(weight), rtol=0, atol=1e-5)
    assert (batch.log_probs[mask] < 0).all()  # real log-probs, not zeros
