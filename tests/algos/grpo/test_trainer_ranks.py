"""GRPO with `--trainers M` (FSDP2 ranks on Ray, nostall/algos/grpo/ranks.py), on a local
cluster: two ranks train the one-rank run (rewards equal, weights within Adam's rounding), with
and without a KL penalty to the reference model;
checkpoints resume at another rank count, both ways, from the k-th checkpoint; staleness 1
trains; a rank killed mid-run ends the run within seconds, naming the rank's failure."""

import dataclasses
import time

import pytest
import torch

from nostall.algos import grpo
from nostall.algos.grpo import sharded
from nostall.algos.grpo.update import METRICS

ray = pytest.importorskip("ray", reason="Ray (a dev dependency) is not installed")

FAST = dict(
    steps=6,
    num_prompts=4,
    num_generations=4,
    watch_syncs=False,
    log_interval=2,
    staleness=0,
    backend="ray",
)
# Adam's normalised step moves an element with near-zero gradients by a fraction of the
# learning rate (1.1e-3) when the gradient's rounding changes: sharded sums round otherwise.
WEIGHT_ATOL = 1e-4


# Ray's CPUs for the module's local cluster (tests/conftest.py's local_cluster).
RAY_CPUS = 3


def _weights(setup) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in setup.lm.model.state_dict().items()}


def _close(a: dict, b: dict) -> None:
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-3, atol=WEIGHT_ATOL)


def _run(args):
    setup = grpo.build(args)
    trainer = grpo.GRPOTrainer(args=args, setup=setup)
    return trainer.train(), _weights(setup), trainer


def test_two_trainer_ranks_train_the_one_rank_run(local_cluster, tmp_path):
    one, one_weights, _ = _run(grpo.GRPOCommandConfig(**FAST))
    two, two_weights, trainer = _run(
        grpo.GRPOCommandConfig(**FAST, trainers=2, output_dir=str(tmp_path))
    )
    assert two.rewards == one.rewards
    _close(two_weights, one_weights)
    assert "on 2 FSDP2 ranks" in trainer.report


def test_a_kl_penalty_to_the_reference_trains_the_one_rank_run(local_cluster):
    """--beta: each rank's share of the reference log-probs from the reference model, sharded
    as the policy is; every figure reported (the k3 KL among them) is the one rank's."""
    args = grpo.GRPOCommandConfig(**FAST, beta=0.5)
    one, one_weights, _ = _run(args)
    two, two_weights, _ = _run(dataclasses.replace(args, trainers=2))
    assert two.rewards == one.rewards
    _close(two_weights, one_weights)
    assert two.metrics["kl"] > 0
    # The figures logged at the last step: each rank's weighted as its loss is (its tokens'
    # share of a token mean), so their mean is the whole batch's.
    update = [k for k in one.metrics if k in METRICS or k.startswith("sampling/")]
    assert len(update) == len(METRICS) + 5
    for name in update:
        value = one.metrics[name]
        assert abs(two.metrics[name] - value) <= 1e-4 + 1e-3 * abs(value), name


def test_lora_adapters_train_the_one_rank_run(local_cluster):
    """--lora-r: the frozen base weights sharded beside the adapters, only these stepped."""
    args = grpo.GRPOCommandConfig(**FAST, lora_r=4)
    one, one_weights, _ = _run(args)
    two, two_weights, _ = _run(dataclasses.replace(args, trainers=2))
    assert two.rewards == one.rewards
    _close(two_weights, one_weights)


def test_gradient_checkpointing_trains_the_one_rank_run(local_cluster, monkeypatch):
    """--gradient-checkpointing: each layer recomputed inside its FSDP unit in the backward."""
    args = grpo.GRPOCommandConfig(**FAST, gradient_checkpointing=True)
    one, one_weights, _ = _run(args)
    enabled = []
    enable = sharded.enable_checkpointing
    monkeypatch.setattr(sharded, "enable_checkpointing", lambda m: enabled.append(enable(m)))
    two, two_weights, _ = _run(dataclasses.replace(args, trainers=2))
    assert two.rewards == one.rewards
    _close(two_weights, one_weights)
    [model] = enabled  # (rank 0's, in this process)
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing


@pytest.mark.parametrize("saved, resumed, k", [(2, 1, 2), (1, 2, 4)])
def test_a_checkpoint_resumes_at_another_rank_count(local_cluster, tmp_path, saved, resumed, k):
    # (--beta: the reference model the ranks shard is the checkpoint's, not the resumed model)
    args = grpo.GRPOCommandConfig(
        **FAST,
        trainers=saved,
        checkpoint=str(tmp_path / "ckpt-{step}.pt"),
        checkpoint_every=2,
        beta=0.5,
    )
    full, full_weights, _ = _run(args)
    again = dataclasses.replace(
        args, trainers=resumed, resume=str(tmp_path / f"ckpt-{k}.pt"), checkpoint=None
    )
    result, weights, _ = _run(again)
    assert result.rewards == full.rewards
    _close(weights, full_weights)


def test_staleness_one_trains_on_two_ranks(local_cluster):
    result, _, _ = _run(grpo.GRPOCommandConfig(**dict(FAST, staleness=1), trainers=2))
    assert len(result.rewards) == FAST["steps"]
    assert result.mean_lag is not None and result.mean_lag <= 1


def test_a_rank_killed_mid_run_ends_it_naming_the_rank(local_cluster):
    args = grpo.GRPOCommandConfig(**dict(FAST, steps=20, log_interval=1), trainers=2)
    setup = grpo.build(args)
    killed = {}

    def kill_at_step_two(step, metrics):
        if step == 2:
            ray.kill(setup.ranks.ranks[0])
            killed["at"] = time.perf_counter()

    with pytest.raises(RuntimeError, match="a trainer rank failed"):
        grpo.GRPOTrainer(args=args, setup=setup).train(log=kill_at_step_two)
    assert time.perf_counter() - killed["at"] < 10.0


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(trainers=0), "--trainers must be at least 1"),
        (dict(trainers=2, backend="thread"), "--trainers > 1 needs --backend ray"),
        (dict(trainers=3, backend="ray"), "--trainers 3 must divide the 4 prompt groups"),
        (
            dict(trainers=2, backend="ray", steps_per_generation=4),
            "--trainers 2 must divide the 1 prompt groups",
        ),
        (
            dict(backend="ray", device="cuda", gpus_per_worker=0),
            "--gpus-per-worker must be above 0|no CUDA",
        ),
        (dict(backend="ray", gpus_per_worker=-1), "--gpus-per-worker must be a finite number"),
    ],
)
def test_settings_the_ranks_cannot_train_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        grpo.GRPOCommandConfig(**dict(num_prompts=4, num_generations=4), **settings).check()


def test_ranks_the_cluster_cannot_hold_are_named_before_they_start(local_cluster):
    """Three ranks of one CPU each beside the worker's on three CPUs: named at once, not
    after the join's timeout."""
    with pytest.raises(ValueError, match=r"ranks 1\.\.3 x 1 CPUs need 3 CPUs; .* has 2 free"):
        _run(grpo.GRPOCommandConfig(**FAST, trainers=4))


def test_workers_on_gpus_the_cluster_lacks_are_named_before_they_start(local_cluster):
    with pytest.raises(ValueError, match="1 workers x 1 GPUs need 1 GPUs; the Ray cluster has 0"):
        _run(grpo.GRPOCommandConfig(**FAST, gpus_per_worker=1))
