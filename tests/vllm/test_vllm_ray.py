"""vLLM engines in Ray workers, their weights sent by a gloo broadcast (`--ray-weights
collective`) instead of the object store: the same run, reward for reward and weight for
weight (staleness 0, float32)."""

import dataclasses

import pytest
import torch

from nostall.algos import grpo

pytestmark = pytest.mark.vllm
ray = pytest.importorskip("ray", reason="Ray is not installed in this venv")


def test_broadcast_weights_train_the_run_the_object_store_trains(local_cluster, model_dir):
    args = grpo.GRPOCommandConfig(
        model=str(model_dir),
        generator="vllm",
        backend="ray",
        staleness=0,
        dtype="float32",
        steps=4,
        max_new_tokens=5,
        learning_rate=1.1e-3,
        watch_syncs=False,
    )
    runs = []
    for weights in ("store", "collective"):
        run_args = dataclasses.replace(args, ray_weights=weights)
        setup = grpo.build(run_args)
        result = grpo.train(run_args, setup=setup)
        runs.append(
            (
                result.rewards,
                {k: v.clone() for k, v in setup.lm.model.state_dict().items()},
                result.weight_pushes,
            )
        )
        # The worker's pushes, timed by its wall clock, on the driver's timeline: at staleness
        # 0 each lies between updates.
        assert sum(side == "push" for side, _, _ in result.timeline.spans) == 4
        assert result.weight_push_overlap == 0.0
    (store_rewards, store_weights, pushes), (rewards, weights, _) = runs
    assert rewards == store_rewards
    assert all(torch.equal(weights[k], store_weights[k]) for k in weights)
    assert pushes == 4


def test_two_trainer_ranks_train_the_one_rank_run_with_vllm_generating(local_cluster, model_dir):
    """--trainers 2 (FSDP2 ranks, the driver and a Ray actor) with a vLLM worker: the
    one-rank run, reward for reward, weights within Adam's rounding of a sharded gradient."""
    args = grpo.GRPOCommandConfig(
        model=str(model_dir),
        generator="vllm",
        backend="ray",
        staleness=0,
        dtype="float32",
        steps=3,
        max_new_tokens=5,
        learning_rate=1.1e-3,
        watch_syncs=False,
    )
    runs = []
    for trainers in (1, 2):
        run_args = dataclasses.replace(args, trainers=trainers)
        setup = grpo.build(run_args)
        result = grpo.train(run_args, setup=setup)
        weights = {k: v.clone() for k, v in setup.lm.model.state_dict().items()}
        runs.append((result.rewards, weights))
    (one_rewards, one_weights), (rewards, weights) = runs
    assert rewards == one_rewards
    for name, value in weights.items():
        torch.testing.assert_close(value, one_weights[name], rtol=1e-3, atol=1e-4)
