"""`--trainers 2 --device cuda`: FSDP2 ranks over NCCL, a GPU each, through the command's path
(GRPOConfig -> build -> train). The run starts its own Ray cluster with the driver's GPU hidden,
so the generation worker and rank 1 take the two others; the result is the one-rank run's on
the GPU (rewards equal, weights within Adam's rounding of sharded sums). Marked gpu; it needs
three GPUs (the driver's, the worker's, rank 1's), so no cluster is started by a fixture here."""

import pytest
import torch

from nostall.algos import grpo
from tests.algos.grpo.test_trainer_ranks import FAST, _close, _run

ray = pytest.importorskip("ray", reason="Ray (a dev dependency) is not installed")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.device_count() < 3,
        reason="needs three CUDA devices (driver, generation worker, rank 1)",
    ),
]


def test_two_ranks_on_gpus_train_the_one_rank_run(tmp_path):
    assert not ray.is_initialized(), "a cluster left by another module would hold every GPU"
    args = grpo.GRPOCommandConfig(**dict(FAST, steps=2), device="cuda", dtype="float32")
    one, one_weights, _ = _run(args)
    two, two_weights, trainer = _run(
        grpo.GRPOCommandConfig(
            **dict(FAST, steps=2),
            device="cuda",
            dtype="float32",
            trainers=2,
            output_dir=str(tmp_path),
        )
    )
    assert two.rewards == one.rewards
    _close(two_weights, one_weights)
    assert "on 2 FSDP2 ranks" in trainer.report
