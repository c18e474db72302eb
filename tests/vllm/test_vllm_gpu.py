"""vLLM generating on a CUDA device, colocated with the trainer: its behaviour log-probs are
the trainer's within bf16's rounding, and at staleness 0 the engine sleeps between batches
(its KV cache and weights hand their memory to the update) and wakes with the new weights."""

import pytest
import torch

from nostall.algos import grpo
from nostall.algos.grpo.setup import build
from tests.lm.log_probs import generated_and_trainer, trainer_log_probs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present"),
]

# bf16 on both sides, each rounding in its own order (0.015 measured on the CPU).
BF16_ATOL = 0.05


def test_colocated_engine_sleeps_between_batches_and_wakes_with_new_weights(model_dir):
    args = grpo.GRPOConfig(model=str(model_dir), generator="vllm", device="cuda",
                           dtype="bfloat16", staleness=0, num_prompts=4, num_generations=4,
                           max_new_tokens=6, watch_syncs=False)  # fmt: skip
    setup = build(args)
    try:
        engine = setup.generator.engine
        assert engine.sleep
        free_before, _ = torch.cuda.mem_get_info()
        behaviour, trainer = generated_and_trainer(setup, args)
        torch.testing.assert_close(behaviour, trainer, atol=BF16_ATOL, rtol=0)
        assert engine._asleep
        free_asleep, _ = torch.cuda.mem_get_info()
        assert free_asleep >= free_before  # its memory is the update's until the next batch
        with setup.writing(), torch.no_grad():
            setup.compute.model.norm.weight.mul_(8.0)
        setup.loop.publish(setup.compute)
        setup.loop.refresh()
        batch = setup.loop.slots[0]
        setup.generator(batch)
        assert engine.pushes == 2
        new = batch.log_probs[batch.completion_mask]
        torch.testing.assert_close(new, trainer_log_probs(setup, args, batch), atol=BF16_ATOL,
                                   rtol=0)  # fmt: skip
    finally:
        setup.loop.close()
