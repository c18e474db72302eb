"""GRPO with TRL's semantics where TRL has them: prompts walked once an epoch in a shuffled
order, conversational prompts through the chat template, TRL's option names and options,
TRL's logged metrics, and log-probs of the distribution the sampler drew from. Each test failed
on the code before it."""

import copy
import dataclasses
import json

import pytest
import torch

from nostall.algos import grpo
from nostall.lm.prompt_source import PromptSource
from tests.lm.log_probs import generated_and_trainer

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
    args = grpo.GRPOCommandConfig(
        num_prompts=4, num_generations=4, watch_syncs=False, max_new_tokens=6, **truncation
    )
    behaviour, trainer = generated_and_trainer(grpo.build(args), args)
    weight = (trainer - behaviour).exp()
    torch.testing.assert_close(weight, torch.ones_like(weight), rtol=0, atol=1e-5)
    assert (behaviour < 0).all()  # real log-probs, not zeros


def test_trls_figures_reach_tensorboard_and_the_report(tmp_path):
    """reward_std, each reward function's mean and std, completion lengths and the clipped
    ratio are logged under TRL's names; the report names the learning rate, the reward
    functions and the dataset."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from nostall.lm.tasks import answer_reward
    from nostall.train.outputs import Progress

    def length_bonus(prompts, completions, **kwargs):
        return [None if i % 2 else float(len(c)) for i, c in enumerate(completions)]

    args = grpo.GRPOCommandConfig(
        steps=4,
        num_prompts=4,
        num_generations=4,
        watch_syncs=False,
        log_interval=2,
        staleness=0,
        output_dir=str(tmp_path),
    )
    trainer = grpo.GRPOTrainer(model="tiny", reward_funcs=[answer_reward, length_bonus], args=args)
    progress = Progress(args.steps, tmp_path, bar=False)
    result = trainer.train(log=progress)
    progress.close()
    logged = result.metrics
    for name in (
        "reward_std",
        "frac_reward_zero_std",
        "rewards/answer_reward/mean",
        "rewards/answer_reward/std",
        "rewards/length_bonus/mean",
        "completions/mean_length",
        "completions/min_length",
        "completions/max_length",
        "completions/clipped_ratio",
        "learning_rate",
    ):
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
    assert report["peak_memory_mib"]["host"] > 100  # (torch and the model, at the least)
    assert "peak memory: host" in (tmp_path / "report.txt").read_text()


def test_batch_stats_are_trls():
    from nostall.lm.stats import batch_stats

    stats = batch_stats(
        [1.0, 1.0, 0.0, 2.0],
        {"f": [1.0, float("nan"), 0.0, 2.0]},
        [3, 5, 5, 2],
        [True, False, False, True],
        2,
    )
    assert stats["reward_std"] == pytest.approx((0 + 2**0.5) / 2)  # unbiased, mean of groups
    assert stats["frac_reward_zero_std"] == 0.5
    assert stats["rewards/f/mean"] == 1.0 and stats["rewards/f/std"] == 1.0
    assert stats["completions/clipped_ratio"] == 0.5
    assert stats["completions/mean_terminated_length"] == 2.5
    assert (stats["completions/min_length"], stats["completions/max_length"]) == (2, 5)


def test_trls_names_set_the_settings_they_name():
    args = grpo.GRPOCommandConfig(
        epsilon=0.3, epsilon_high=0.28, num_iterations=2, max_completion_length=7
    )
    assert (args.clip_low, args.clip_high, args.updates_per_batch, args.max_new_tokens) == (
        0.3,
        0.28,
        2,
        7,
    )
    with pytest.raises(ValueError, match=r"--epsilon 0\.3 and --clip-low 0\.1 name the same"):
        grpo.GRPOCommandConfig(epsilon=0.3, clip_low=0.1)
    from nostall.cli import _parser

    parsed = _parser().parse_args(
        ["train", "grpo", "--epsilon", "0.25", "--max-completion-length", "6"]
    )
    from nostall.config_flags import config_from

    args = config_from(parsed, grpo.GRPOCommandConfig)
    assert (args.clip_low, args.max_new_tokens) == (0.25, 6)


def _updated(args, batch_seed=0):
    setup = grpo.build(args)
    batch = setup.loop.slots[0]
    torch.manual_seed(batch_seed)
    setup.generator(batch)
    grpo.grpo_update(
        grpo.UpdateContext(
            setup.decoder,
            setup.optimizer,
            args,
            setup.vocab,
            setup.group_index,
            eos_token_id=setup.lm.eos_token_id,
        ),
        batch,
        False,
    )
    return setup, batch


def test_accumulated_micro_batches_give_the_full_batch_step():
    """Under the grpo loss (a mean over sequences) two accumulated micro-batches of whole
    groups give the full batch's gradient, for one optimizer step. (Compared as gradients:
    Adam's first step is lr times the gradient's sign, which rounding can flip where a
    component is near zero.)"""
    base = dict(
        num_prompts=4,
        num_generations=4,
        watch_syncs=False,
        loss_type="grpo",
        entropy_coef=0.0,
        max_grad_norm=1e9,
    )
    full, _ = _updated(grpo.GRPOCommandConfig(**base))
    split, _ = _updated(
        grpo.GRPOCommandConfig(**base, steps_per_generation=2, gradient_accumulation_steps=2)
    )
    want = full.optimizer.flat_gradient
    assert want.abs().max() > 0
    torch.testing.assert_close(split.optimizer.flat_gradient, want, rtol=1e-4, atol=1e-6)
    assert int(split.optimizer.state_dict()["state"][0]["step"]) == 1  # one step
    twice, _ = _updated(grpo.GRPOCommandConfig(**base, steps_per_generation=2))  # two steps
    assert int(twice.optimizer.state_dict()["state"][0]["step"]) == 2


def test_bad_micro_batch_settings_are_refused():
    with pytest.raises(ValueError, match="must split into 3 micro-batches"):
        grpo.GRPOCommandConfig(num_prompts=4, steps_per_generation=3).check()
    with pytest.raises(ValueError, match="must be a multiple of --gradient-accumulation-steps"):
        grpo.GRPOCommandConfig(steps_per_generation=2, gradient_accumulation_steps=4).check()


def test_truncated_completions_can_be_left_out_of_the_loss():
    """With every completion cut off by max_new_tokens, mask_truncated_completions leaves
    nothing to learn from: the update moves no parameter (it does without the option)."""
    base = dict(num_prompts=2, num_generations=4, watch_syncs=False, learning_rate=1e-2)
    for masked in (True, False):
        args = grpo.GRPOCommandConfig(**base, mask_truncated_completions=masked)
        setup = grpo.build(args)
        batch = setup.loop.slots[0]
        setup.generator(batch)
        batch.completion_mask.fill_(True)
        batch.completion_ids[:, -1] = 3  # a letter: no row ends with <eos>
        batch.rewards.copy_(torch.arange(8, dtype=torch.float32))
        before = copy.deepcopy(setup.lm.model.state_dict())
        grpo.grpo_update(
            grpo.UpdateContext(
                setup.decoder,
                setup.optimizer,
                args,
                setup.vocab,
                setup.group_index,
                eos_token_id=setup.lm.eos_token_id,
            ),
            batch,
            False,
        )
        moved = [k for k, v in setup.lm.model.state_dict().items() if not torch.equal(v, before[k])]
        assert (not moved) if masked else moved


@pytest.mark.parametrize(
    ("kind", "want"),
    [
        ("constant", [0.0, 0.5, 1.0, 1.0, 1.0]),
        ("linear", [0.0, 0.5, 1.0, 2 / 3, 1 / 3]),
        ("cosine", [0.0, 0.5, 1.0, 0.75, 0.25]),
    ],
)
def test_the_learning_rate_schedule_is_transformers(kind, want):
    args = grpo.GRPOCommandConfig(
        steps=5, learning_rate=1.0, lr_scheduler_type=kind, warmup_steps=2
    )
    assert [args.learning_rate_at(s) for s in range(1, 6)] == pytest.approx(want)
    ratio = grpo.GRPOCommandConfig(steps=10, warmup_ratio=0.25)  # ceil(2.5) = 3 steps of warm-up
    assert ratio.learning_rate_at(3) < ratio.learning_rate == ratio.learning_rate_at(4)


def test_a_scheduled_run_logs_its_learning_rate():
    seen = []
    args = grpo.GRPOCommandConfig(
        steps=4,
        num_prompts=2,
        num_generations=2,
        watch_syncs=False,
        log_interval=1,
        lr_scheduler_type="linear",
        staleness=0,
    )
    grpo.GRPOTrainer(args=args).train(log=lambda step, values: seen.append(values["learning_rate"]))
    assert seen == pytest.approx([args.learning_rate_at(s) for s in range(1, 5)])


def test_weight_decay_is_adamws():
    from nostall.optim import ClippedAdam

    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5, 3))
    b = torch.nn.Parameter(a.detach().clone())
    mine = ClippedAdam([a], lr=0.1, max_grad_norm=1e9, weight_decay=0.3)
    theirs = torch.optim.AdamW([b], lr=0.1, weight_decay=0.3)
    for _ in range(3):
        grad = torch.randn(5, 3)
        a.grad.copy_(grad)
        b.grad = grad.clone()
        mine.step()
        theirs.step()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_repetition_penalty_and_min_p_are_transformers():
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
    )

    args = grpo.GRPOCommandConfig(
        repetition_penalty=1.3, min_p=0.2, temperature=0.7, num_prompts=2, num_generations=2
    )
    engine = grpo.build(args).generator.engine
    torch.manual_seed(0)
    logits = torch.randn(2, 22) * 3
    ids = torch.tensor([[4, 5, 5], [7, 8, 9]])
    seen = torch.zeros(2, 23, dtype=torch.bool)
    seen.scatter_(1, ids, True)
    engine.allowed[:] = True
    mine = engine._processed(logits, seen)
    penalised = RepetitionPenaltyLogitsProcessor(1.3)(ids, logits.clone())
    assert torch.equal(mine.isinf(), MinPLogitsWarper(0.2)(ids, penalised / 0.7).isinf())
    kept = ~mine.isinf()
    torch.testing.assert_close(mine[kept], penalised[kept])


def test_a_run_with_min_p_and_repetition_penalty_records_the_policys_log_probs():
    args = grpo.GRPOCommandConfig(
        repetition_penalty=1.5,
        min_p=0.1,
        num_prompts=4,
        num_generations=4,
        watch_syncs=False,
        max_new_tokens=6,
    )
    behaviour, trainer = generated_and_trainer(grpo.build(args), args)
    torch.testing.assert_close(trainer, behaviour, rtol=0, atol=1e-5)


def test_completions_are_logged_and_old_checkpoints_pruned(tmp_path):
    args = grpo.GRPOCommandConfig(
        steps=5,
        num_prompts=2,
        num_generations=2,
        watch_syncs=False,
        log_interval=2,
        staleness=0,
        output_dir=str(tmp_path),
        log_completions=True,
        checkpoint=str(tmp_path / "c-{step:03d}.pt"),
        checkpoint_every=1,
        save_total_limit=2,
    )
    grpo.GRPOTrainer(args=args).train()
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [2, 4, 5] and len(rows) == 3 * 4
    assert {"prompt", "completion", "reward"} <= set(rows[0])
    assert sorted(p.name for p in tmp_path.glob("c-*.pt")) == ["c-004.pt", "c-005.pt"]
    resumed = dataclasses.replace(args, steps=7, resume=str(tmp_path / "c-005.pt"))
    grpo.GRPOTrainer(args=resumed).train()
    assert sorted(p.name for p in tmp_path.glob("c-*.pt")) == ["c-006.pt", "c-007.pt"]
    with pytest.raises(ValueError, match="--save-total-limit needs --checkpoint with"):
        grpo.GRPOCommandConfig(save_total_limit=2, checkpoint="c.pt").check()


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}={% endif %}"
)


def test_conversational_prompts_go_through_the_chat_template(tmp_path):
    """TRL's conversational format: the prompt is rendered with the tokenizer's chat template
    and the generation prompt; the rewards get the messages and assistant-message
    completions; the saved model keeps the template."""
    from nostall.lm.models import load_model

    lm = load_model("tiny", seed=0)
    lm.tokenizer.chat_template = CHAT_TEMPLATE
    rows = [
        {"prompt": [{"role": "user", "content": s}], "answer": s}
        for s in ("abcde", "hgfed", "cabbe", "dghaa")
    ]
    seen = {}

    def reward(prompts, completions, answer, **kwargs):
        seen.update(prompt=prompts[0], completion=completions[0])
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer, strict=True)]

    args = grpo.GRPOCommandConfig(
        steps=3,
        num_prompts=2,
        num_generations=2,
        watch_syncs=False,
        staleness=0,
        output_dir=str(tmp_path),
    )
    trainer = grpo.GRPOTrainer(
        model=lm.model,
        processing_class=lm.tokenizer,
        reward_funcs=reward,
        train_dataset=rows,
        args=args,
    )
    encoder = trainer.setup.generator.encoder
    assert encoder.length == len("abcde=")  # the template's generation prompt, "="
    trainer.train()
    assert seen["prompt"][0]["role"] == "user"
    assert seen["completion"][0]["role"] == "assistant"
    assert isinstance(seen["completion"][0]["content"], str)
    saved = (tmp_path / "model" / "tokenizer_config.json").read_text()
    assert "add_generation_prompt" in saved or (tmp_path / "model" / "chat_template.jinja").exists()


def test_conversational_prompts_without_a_chat_template_are_refused():
    rows = [{"prompt": [{"role": "user", "content": "abcde"}]}]
    with pytest.raises(ValueError, match="need a tokenizer with a chat template"):
        grpo.GRPOTrainer(
            model="tiny",
            reward_funcs=lambda prompts, completions, **k: [0.0],
            train_dataset=rows,
            args=grpo.GRPOCommandConfig(watch_syncs=False),
        )
    with pytest.raises(ValueError, match="mixes text and conversational prompts"):
        grpo.GRPOTrainer(
            model="tiny",
            train_dataset=[*rows, {"prompt": "abcde="}],
            args=grpo.GRPOCommandConfig(watch_syncs=False),
        )
    with pytest.raises(ValueError, match="must be a string or a conversation"):
        grpo.GRPOTrainer(
            model="tiny",
            train_dataset=[{"prompt": 5}],
            args=grpo.GRPOCommandConfig(watch_syncs=False),
        )


def test_a_setting_the_config_lacks_is_refused_with_the_closest_names():
    """A TRL script's name nostall does not take is a ValueError naming it and what is close,
    never Python's bare "unexpected keyword argument"; SB3's names on PPO likewise."""
    from nostall.algos import appo, ppo

    with pytest.raises(
        ValueError, match=r"GRPOConfig has no setting 'max_step' \(closest: max_steps"
    ):
        grpo.GRPOConfig(max_step=3)
    with pytest.raises(ValueError, match=r"'learning_rte' \(closest: learning_rate\)"):
        grpo.GRPOCommandConfig(learning_rte=1e-3)
    with pytest.raises(ValueError, match=r"PPOConfig has no setting 'n_steps' \(closest: num_st"):
        ppo.PPOConfig(n_steps=8)
    with pytest.raises(ValueError, match=r"APPOConfig has no setting 'num_env' \(closest: num_"):
        appo.APPOConfig(num_env=4)
    assert (
        grpo.GRPOCommandConfig(steps=3).steps == 3
    )  # known names and dataclasses.replace untouched
    assert dataclasses.replace(grpo.GRPOCommandConfig(), steps=5).steps == 5
