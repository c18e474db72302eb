"""Language-model GRPO on a GPU (marked `gpu`; tools/gpu_check.sh runs them where a device is
lent): bf16 compute over float32 master weights on CUDA, the lean forward (decode steps under
a CUDA graph) and the generic one (a model's own forward and cache), behaviour log-probs
agreeing with the trainer's, and no host sync in a decode step or an update."""

import pytest
import torch

from nostall.algos import grpo
from nostall.lm.models import LanguageModel
from tests.lm.architectures import build
from tests.lm.log_probs import generated_and_trainer
from tests.lm.test_any_architecture import ATOL, BF16_ATOL

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present"),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_generation_and_trainer_agree_on_the_gpu(arch, dtype):
    model, tokenizer = build(arch)
    args = grpo.GRPOCommandConfig(
        num_prompts=2,
        num_generations=3,
        max_new_tokens=6,
        top_k=5,
        watch_syncs=False,
        device="cuda",
        dtype=dtype,
    )
    setup = grpo.build(args, grpo.Inputs(lm=LanguageModel(model, tokenizer, arch)))
    assert setup.decoder.output_weight.device.type == "cuda"
    behaviour, trainer = generated_and_trainer(setup, args)
    atol = ATOL if dtype == "float32" else BF16_ATOL
    torch.testing.assert_close(trainer, behaviour, rtol=0, atol=atol)


@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_bf16_gpu_run_trains_without_a_sync(arch, staleness):
    model, tokenizer = build(arch)
    args = grpo.GRPOCommandConfig(
        num_prompts=2,
        num_generations=4,
        max_new_tokens=6,
        steps=6,
        device="cuda",
        dtype="auto",
        staleness=staleness,
        learning_rate=1e-3,
    )
    trainer = grpo.GRPOTrainer(model=model, processing_class=tokenizer, args=args)
    assert trainer.setup.compute.get_input_embeddings().weight.dtype == torch.bfloat16
    result = trainer.train()
    assert result.syncs_per_update == 0, result.sync_sites
    assert result.syncs_per_decode_step == 0, result.sync_sites
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
