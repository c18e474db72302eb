"""TRL's optimizers=(optimizer, lr_scheduler): a user's AdamW and scheduler drive nostall's own
optimizer, resume exactly, and what cannot be carried over is refused by name."""

from __future__ import annotations

import pytest
import torch

from nostall import GRPOConfig, GRPOTrainer
from nostall.algos.grpo.user_optimizer import take_optimizers
from tests.lm import architectures

ROWS = [{"prompt": "ab" * (i % 3 + 1)} for i in range(12)]


def reward_len(completions, **kwargs):
    return [-abs(4 - len(c)) for c in completions]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    architectures.save("qwen2", folder)
    return folder


def trainer(model_dir, out, max_steps, schedule=True, resume=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # (warm-up then decay: a rate that differs at every step)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / (1 + s * s))
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=max_steps,
        save_steps=1,
        logging_steps=1,
        max_completion_length=6,
        num_generations=4,
        per_device_train_batch_size=4,
        use_cpu=True,
    )
    run = GRPOTrainer(
        model=model,
        reward_funcs=reward_len,
        args=args,
        train_dataset=ROWS,
        optimizers=(optimizer, scheduler if schedule else None),
    )
    run.train(resume_from_checkpoint=resume)
    return run


def rates(run):
    return [e["learning_rate"] for e in run.state.log_history if "loss" in e]


@pytest.mark.parametrize("k", [1, 3])
def test_a_resume_from_the_kth_checkpoint_trains_at_the_schedules_rates(model_dir, tmp_path, k):
    whole = trainer(model_dir, tmp_path / "whole", 5)
    trainer(model_dir, tmp_path / "part", k)
    resumed = trainer(model_dir, tmp_path / "part", 5, resume=True)
    assert rates(whole) == pytest.approx([1e-2 * (s + 1) / (1 + s * s) for s in range(5)])
    assert rates(resumed) == pytest.approx(rates(whole))
    assert resumed.result.rewards == whole.result.rewards


def test_a_resume_without_the_runs_scheduler_is_refused(model_dir, tmp_path):
    trainer(model_dir, tmp_path / "out", 2)
    with pytest.raises(ValueError, match=r"optimizers: the run of the checkpoint .* was given"):
        trainer(model_dir, tmp_path / "out", 4, schedule=False, resume=True)


def test_without_a_scheduler_the_optimizers_rate_follows_lr_scheduler_type(model_dir, tmp_path):
    run = trainer(model_dir, tmp_path / "out", 2, schedule=False)
    assert run.config.learning_rate == 1e-2
    assert rates(run) == pytest.approx([run.config.learning_rate_at(s) for s in (1, 2)])


def _model():
    return torch.nn.Linear(3, 2)


def _bad_pairs():
    m = _model()
    params = list(m.parameters())
    stepped = torch.optim.AdamW(params)
    m(torch.ones(3)).sum().backward()
    stepped.step()
    other = torch.optim.AdamW(_model().parameters())
    adamw = torch.optim.AdamW(params)
    return m, [
        ((torch.optim.SGD(params, lr=0.1), None), "SGD is not an Adam"),
        (
            (torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "lr": 1.0}]), None),
            "groups differ in lr",
        ),
        ((torch.optim.AdamW(params, amsgrad=True), None), "amsgrad"),
        ((torch.optim.Adam(params, weight_decay=0.1), None), "L2 term"),
        ((stepped, None), "already stepped"),
        ((other, None), "build it over model.parameters"),
        ((None, torch.optim.lr_scheduler.LambdaLR(adamw, lambda s: 1.0)), "needs the optimizer"),
        ((adamw, torch.optim.lr_scheduler.ReduceLROnPlateau(adamw)), "ReduceLROnPlateau"),
        ((adamw, torch.optim.lr_scheduler.LambdaLR(other, lambda s: 1.0)), "another optimizer"),
        ((adamw, "linear"), "not a torch LRScheduler"),
        ((adamw,), "a pair"),
        ("adamw", "a pair"),
    ]


def test_what_cannot_be_carried_over_is_refused_by_name():
    model, cases = _bad_pairs()
    for pair, message in cases:
        with pytest.raises(ValueError, match=message):
            take_optimizers(pair, model, None, GRPOConfig())
    adamw = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match="give the model object"):
        take_optimizers((adamw, None), "tiny", None, GRPOConfig())
    with pytest.raises(ValueError, match="peft_config"):
        take_optimizers((adamw, None), model, object(), GRPOConfig())
    assert take_optimizers((None, None), model, None, GRPOConfig()) is None
