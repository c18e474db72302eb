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
    args = grpo.GRPOCommandConfig(
        model=str(model_dir),
        generator="vllm",
        device="cuda",
        dtype="bfloat16",
        staleness=0,
        num_prompts=4,
        num_generations=4,
        max_new_tokens=6,
        watch_syncs=False,
    )
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
        torch.testing.assert_close(
            new, trainer_log_probs(setup, args, batch), atol=BF16_ATOL, rtol=0
        )
    finally:
        setup.loop.close()


def _ray_run(model_dir, **settings):
    ray = pytest.importorskip("ray", reason="Ray is not installed in this venv")
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        args = grpo.GRPOCommandConfig(
            model=str(model_dir),
            generator="vllm",
            device="cuda",
            backend="ray",
            dtype="float32",
            staleness=0,
            steps=4,
            max_new_tokens=5,
            learning_rate=1.1e-3,
            log_interval=2,
            watch_syncs=False,
            **settings,
        )
        return grpo.train(args)
    finally:
        ray.shutdown()


def test_a_ray_worker_generates_with_vllm_on_a_gpu_from_each_version(model_dir):
    """A worker reserving the GPU (shared with the trainer: the object store's weights) gets
    every version: its behaviour log-probs are the trainer's at the batch's first step."""
    result = _ray_run(model_dir, vllm_gpu_memory_utilization=0.2)
    assert len(result.rewards) == 4 and result.weight_pushes == 4
    assert result.metrics["sampling/sampling_logp_difference/max"] < 1e-3


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="NCCL weights need two CUDA devices "
    "(the trainer's and the worker's: NCCL takes one device a rank)",
)
def test_nccl_weights_train_the_run_the_object_store_trains(model_dir):
    store = _ray_run(model_dir)
    nccl = _ray_run(model_dir, ray_weights="collective")
    assert nccl.rewards == store.rewards
