"""Options that bound the update's memory: --gradient-checkpointing (the model's own forward,
recomputing activations in the backward) gives the same gradients; --micro-batch-size (TRL's
per_device_train_batch_size) splits the batch into micro-batches of whole groups."""

import pytest
import torch

from nostall.algos import grpo
from nostall.lm.hf_decoder import HFDecoder


def _gradients(args):
    setup = grpo.build(args)
    batch = setup.loop.slots[0]
    torch.manual_seed(0)
    setup.generator(batch)
    batch.rewards.copy_(torch.arange(batch.rewards.numel(), dtype=torch.float32) % 3)
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
    return setup, {n: p.grad.clone() for n, p in setup.lm.model.named_parameters()}


def test_gradient_checkpointing_gives_the_same_gradients():
    base = dict(
        num_prompts=2, num_generations=4, watch_syncs=False, max_grad_norm=1e9, entropy_coef=0.1
    )
    _, want = _gradients(grpo.GRPOCommandConfig(**base))
    checkpointed, got = _gradients(grpo.GRPOCommandConfig(**base, gradient_checkpointing=True))
    assert isinstance(checkpointed.decoder, HFDecoder)
    model = checkpointed.lm.model
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    assert any(g.abs().max() > 0 for g in want.values())
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, rtol=1e-3, atol=1e-6, msg=name)


def test_micro_batch_size_sets_the_micro_batches():
    args = grpo.GRPOCommandConfig(num_prompts=4, num_generations=4, micro_batch_size=8)
    args.check()
    assert args.micro_batches == 2
    with pytest.raises(ValueError, match="must be a multiple of --num-generations 4"):
        grpo.GRPOCommandConfig(num_prompts=4, num_generations=4, micro_batch_size=6).check()
    with pytest.raises(ValueError, match="disagree"):
        grpo.GRPOCommandConfig(num_prompts=4, micro_batch_size=8, steps_per_generation=2).check()


def test_generation_on_a_thread_reads_the_trainers_own_weights(tmp_path):
    """The thread backend's generation side holds no copy of the weights and publishing copies
    nothing, at staleness 0 and (on the CPU, taking turns on them) at 1."""
    from nostall.runtime.shared_weights import SharedWeights

    for staleness in (0, 1):
        setup = grpo.build(grpo.GRPOCommandConfig(staleness=staleness, watch_syncs=False))
        assert setup.generator.model is setup.lm.model
        assert isinstance(setup.loop.weights, SharedWeights)
    bf16 = grpo.build(grpo.GRPOCommandConfig(staleness=1, dtype="bfloat16", watch_syncs=False))
    assert bf16.generator.model is bf16.compute and bf16.compute is not bf16.lm.model
    assert isinstance(bf16.loop.weights, SharedWeights)
