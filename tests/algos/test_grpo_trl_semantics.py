"""GRPO with TRL's semantics where TRL has them: prompts walked once an epoch in a shuffled
order, conversational prompts through the chat template, TRL's option names and options,
TRL's logged metrics, and log-probs of the distribution the sampler drew from. Each test failed
on the code before it."""

import json

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


def test_trls_figures_reach_tensorboard_and_the_report(tmp_path):
    """reward_std, each reward function's mean and std, completion lengths and the clipped
    ratio are logged under TRL's names; the report names the learning rate, the reward
    functions and the dataset."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from nostall.lm.tasks import answer_reward
    from nostall.train.outputs import Progress

    def length_bonus(prompts, completions, **kwargs):
        return [None if i % 2 else float(len(c)) for i, c in enumerate(completions)]

    args = grpo.GRPOConfig(steps=4, num_prompts=4, num_generations=4, watch_syncs=False,
                           log_interval=2, staleness=0, output_dir=str(tmp_path))  # fmt: skip
    trainer = grpo.GRPOTrainer(model="tiny", reward_funcs=[answer_reward, length_bonus],
                               args=args)  # fmt: skip
    progress = Progress(args.steps, tmp_path, bar=False)
    result = trainer.train(progress)
    progress.close()
    logged = result.metrics
    for name in ("reward_std", "frac_reward_zero_std", "rewards/answer_reward/mean",
                 "rewards/answer_reward/std", "rewards/length_bonus/mean",
                 "completions/mean_length", "completions/min_length", "completions/max_length",
                 "completions/clipped_ratio", "learning_rate"):  # fmt: skip
        assert name in logged, name
    assert 1 <= logged["completions/min_length"] <= logged["completions/mean_length"]
    assert logged["completions/mean_length"] <= logged["completions/max_length"] <= 5
    assert 0 <= logged["completions/clipped_ratio"] <= 1
    # The bonus counts only where it applied (None elsewhere): its mean is a mean length.
    assert 0 <= logged["rewards/length_bonus/mean"] <= 5
    events = EventAccumulator(str(progress.log_dir))
    events.Reload()
    assert "train/completions/clipped_ratio" in events.Tags()["scalars"]
    assert "train/rewards/answer_reward/mean" in events.Tags()["scalars"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["learning_rate"] == args.learning_rate
    assert report["reward_functions"] == ["answer_reward", "length_bonus"]
    assert report["dataset"] == "task copy"
    assert report["last_logged"]["reward_std"] == pytest.approx(logged["reward_std"])


def test_batch_stats_are_trls():
    from nostall.lm.stats import batch_stats

    stats = batch_stats([1.0, 1.0, 0.0, 2.0], {"f": [1.0, float("nan"), 0.0, 2.0]},
                        [3, 5, 5, 2], [True, False, False, True], 2)  # fmt: skip
    assert stats["reward_std"] == pytest.approx((0 + 2**0.5) / 2)  # unbiased, mean of groups
    assert stats["frac_reward_zero_std"] == 0.5
    assert stats["rewards/f/mean"] == 1.0 and stats["rewards/f/std"] == 1.0
    assert stats["completions/clipped_ratio"] == 0.5
    assert stats["completions/mean_terminated_length"] == 2.5
    assert (stats["completions/min_length"], stats["completions/max_length"]) == (2, 5)
