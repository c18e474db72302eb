"""LoRA through peft (--lora-r): only the adapters train, the run saves the adapter, which
peft loads back over the base model; checkpoints resume exactly; generation and trainer agree."""

import dataclasses

import pytest
import torch

from nostall.algos import grpo
from nostall.lm.hf_decoder import make_decoder
from tests.lm.log_probs import generated_and_trainer, trainer_log_probs

peft = pytest.importorskip("peft", reason="LoRA needs peft (pip install 'peft>=0.15')")

FAST = dict(
    num_prompts=2,
    num_generations=4,
    watch_syncs=False,
    staleness=0,
    lora_r=4,
    learning_rate=1e-2,
    log_interval=1,
)


def test_only_the_adapters_train_and_the_adapter_reloads(tmp_path):
    from nostall.lm.models import builtin_model

    args = grpo.GRPOCommandConfig(steps=3, output_dir=str(tmp_path), **FAST)
    trainer = grpo.GRPOTrainer(args=args)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    after = trainer.model.state_dict()
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert moved and all("lora_" in k for k in moved), sorted(moved)[:5]
    saved = tmp_path / "model"
    assert (saved / "adapter_config.json").exists()
    assert (saved / "adapter_model.safetensors").exists()
    base = builtin_model("tiny", seed=args.seed).model
    reloaded = peft.PeftModel.from_pretrained(base, saved)
    mine = {k: v for k, v in reloaded.state_dict().items() if "lora_" in k}
    assert mine and all(torch.equal(v, after[k]) for k, v in mine.items())


def test_generation_and_trainer_agree_with_adapters():
    args = grpo.GRPOCommandConfig(**{**FAST, "lora_r": 8})
    setup = grpo.build(args)
    with torch.no_grad():  # adapters that do something (peft starts them at zero)
        for name, p in setup.lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    setup.loop.publish(setup.lm.model)  # (the generation side's copy takes them)
    setup.loop.weights.pull(setup.generator.model, -1)
    behaviour, trainer = generated_and_trainer(setup, args)
    torch.testing.assert_close(trainer, behaviour, rtol=0, atol=2e-5)
    # The same batch through the model without its adapters: other log-probs.
    plain = trainer_log_probs(
        setup, args, setup.loop.slots[0], make_decoder(setup.lm.model.get_base_model())
    )
    assert not torch.allclose(trainer, plain)  # the adapters count


@pytest.mark.parametrize("k", [1, 2])
def test_a_lora_run_resumes_exactly_from_the_kth_checkpoint(tmp_path, k):
    args = grpo.GRPOCommandConfig(
        steps=3, checkpoint=str(tmp_path / "c-{step}.pt"), checkpoint_every=1, **FAST
    )
    straight = grpo.GRPOTrainer(args=args).train()
    resumed = grpo.GRPOTrainer(
        args=dataclasses.replace(
            args, resume=str(tmp_path / f"c-{k}.pt"), checkpoint=str(tmp_path / "r-{step}.pt")
        )
    ).train()
    assert resumed.rewards == straight.rewards


def test_the_seed_alone_draws_the_adapters():
    """Two builds with one seed start from one set of adapters whatever the process drew
    between them (a model directory loads without drawing: the adapters were all it drew)."""

    def adapters(seed):
        setup = grpo.build(grpo.GRPOCommandConfig(**FAST, seed=seed))
        return {k: v.clone() for k, v in setup.lm.model.state_dict().items() if "lora_A" in k}

    first = adapters(3)
    torch.rand(100)
    again, other = adapters(3), adapters(4)
    assert first and all(torch.equal(first[k], again[k]) for k in first)
    assert not any(torch.equal(first[k], other[k]) for k in first)
