"""Reward models, as TRL's GRPOTrainer takes them: a sequence-classification model object (with
reward_processing_classes, or its tokenizer saved beside it), a directory or a cached Hub id;
each prompt and completion joined and scored by the model's first logit. The batch's scores
(right-padded together) agree with each text scored alone, unpadded: padding and pooling change
nothing beyond float32 rounding of the same products."""

import pytest
import torch

from nostall.algos.grpo import GRPOConfig, GRPOTrainer
from nostall.lm.models import char_tokenizer
from nostall.lm.reward_models import RewardModel
from nostall.lm.rewards import load_reward
from tests.algos.test_python_api import copy_rows
from tests.lm.architectures import _configs


def reward_model(seed: int = 0):
    from transformers import AutoModelForSequenceClassification

    config = _configs()["qwen2"]
    config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config)
    return model.eval(), char_tokenizer()


def test_a_batch_scores_as_each_text_alone():
    model, tokenizer = reward_model()
    scorer = RewardModel(model, tokenizer, "rm")
    prompts, completions = ["ab=", "cde=", "a="], ["ba", "edcba", ""]
    scores = scorer(prompts, completions)
    for prompt, completion, score in zip(prompts, completions, scores, strict=True):
        ids = tokenizer(prompt + completion, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            alone = model(**ids).logits[0, 0].item()
        # (the same products over the same tokens; the batch's padded rows change the order
        # of nothing the pooled position reads)
        assert score == pytest.approx(alone, rel=1e-5, abs=1e-6)
    assert scorer.__name__ == "rm"


def test_a_reward_model_object_or_directory_trains_a_run(tmp_path):
    model, tokenizer = reward_model()
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=8,
        save_strategy="no",
        watch_syncs=False,
        logging_steps=1,
    )
    trainer = GRPOTrainer(
        model="tiny",
        reward_funcs=[model],
        reward_processing_classes=[tokenizer],
        train_dataset=copy_rows(8),
        args=args,
    )
    trainer.train()
    name = trainer.setup.reward_names[0]
    assert all(f"rewards/{name}/mean" in e for e in trainer.state.log_history if "loss" in e)
    by_path = load_reward(str(tmp_path / "rm"))  # (what a rollout process loads by name)
    assert by_path(["ab="], ["ba"]) == pytest.approx(RewardModel(model, tokenizer)(["ab="], ["ba"]))


def test_a_reward_that_is_neither_a_function_nor_a_model_is_named():
    with pytest.raises(ValueError, match="reward 'nosuchthing' must be given as module:function"):
        load_reward("nosuchthing")
    with pytest.raises(ValueError, match="reward_processing_classes: 2 given for 1"):
        GRPOTrainer(
            model="tiny",
            reward_funcs=[reward_model()[0]],
            reward_processing_classes=[char_tokenizer(), char_tokenizer()],
            train_dataset=copy_rows(8),
            args=GRPOConfig(max_steps=1),
        )
