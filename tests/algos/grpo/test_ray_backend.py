"""GRPO with generation on Ray workers (`backend="ray"`, nostall/runtime/ray/loop.py, the same
loop interface as the thread and process backends): the thread backend's run at staleness 0
with one worker, bit for bit; exact resume across backends from the k-th checkpoint; two
workers generating apart, every batch trained on once within the staleness bound."""

import dataclasses

import pytest
import torch

from nostall.algos import grpo

ray = pytest.importorskip("ray", reason="Ray (a dev dependency) is not installed")

# Staleness 0 unless a test says otherwise: bit-for-bit comparisons need the synchronous run.
FAST = dict(
    steps=6, num_prompts=4, num_generations=4, watch_syncs=False, log_interval=2, staleness=0
)


def _parameters(setup) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in setup.lm.model.state_dict().items()}


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_staleness_zero_one_worker_matches_the_thread_backend_bit_for_bit(local_cluster):
    args = grpo.GRPOCommandConfig(**FAST)
    thread = grpo.build(args)
    expected = grpo.train(args, setup=thread)
    ray_args = dataclasses.replace(args, backend="ray")
    on_ray = grpo.build(ray_args)
    result = grpo.train(ray_args, setup=on_ray)
    assert result.rewards == expected.rewards
    assert _same(_parameters(on_ray), _parameters(thread))


@pytest.mark.parametrize("k", [2, 4])
def test_resume_from_the_kth_checkpoint_moves_between_thread_and_ray(local_cluster, tmp_path, k):
    args = grpo.GRPOCommandConfig(
        **dict(FAST, steps=8), checkpoint=str(tmp_path / "ckpt-{step}.pt"), checkpoint_every=2
    )
    full = grpo.build(args)
    result = grpo.train(args, setup=full)
    resumed_args = dataclasses.replace(
        args,
        backend="ray",
        resume=str(tmp_path / f"ckpt-{k}.pt"),
        checkpoint=str(tmp_path / "again-{step}.pt"),
    )
    resumed = grpo.build(resumed_args)
    assert grpo.train(resumed_args, setup=resumed).rewards == result.rewards
    assert _same(_parameters(full), _parameters(resumed))
    back_args = dataclasses.replace(args, resume=str(tmp_path / "again-6.pt"), checkpoint=None)
    back = grpo.build(back_args)
    assert grpo.train(back_args, setup=back).rewards == result.rewards
    assert _same(_parameters(full), _parameters(back))


def test_two_generation_workers_every_batch_once_within_the_bound(local_cluster, tmp_path):
    args = grpo.GRPOCommandConfig(
        **dict(FAST, staleness=1),
        backend="ray",
        num_workers=2,
        checkpoint=str(tmp_path / "c-{step}.pt"),
        checkpoint_every=2,
    )
    setup = grpo.build(args)
    lags, lag = [], setup.loop.lag
    setup.loop.lag = lambda batch: lags.append(lag(batch)) or lags[-1]
    result = grpo.train(args, setup=setup)
    trained = setup.loop.trained
    assert len(trained) == len(set(trained)) == 6
    assert {worker for worker, _ in trained} == {0, 1}  # batch k from worker k mod 2
    assert len(lags) == 6 and max(lags) <= 1 and result.mean_lag is not None
    # Its checkpoints hold both workers' generators and resume exactly.
    again_args = dataclasses.replace(args, resume=str(tmp_path / "c-2.pt"), checkpoint=None)
    again = grpo.build(again_args)
    again_result = grpo.train(again_args, setup=again)
    assert again_result.rewards == result.rewards, (again_result.rewards, result.rewards)
    assert _same(_parameters(setup), _parameters(again))


def test_bad_ray_arguments_are_named():
    with pytest.raises(ValueError, match="--num-workers > 1 needs --backend ray"):
        grpo.GRPOCommandConfig(num_workers=2).check()
    with pytest.raises(ValueError, match="--inflight-weights is not available with --backend ray"):
        grpo.GRPOCommandConfig(backend="ray", staleness=1, inflight_weights=True).check()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
def test_a_worker_on_the_gpu_trains_the_thread_backends_run(local_cluster):
    """--device cuda: the worker generates on the GPU it reserves (here the trainer's too), its
    batches on that GPU until they travel through the store; the thread backend's run."""
    args = grpo.GRPOCommandConfig(**dict(FAST, steps=4), device="cuda", dtype="float32")
    expected = grpo.train(args)
    result = grpo.train(dataclasses.replace(args, backend="ray"))
    assert result.rewards == expected.rewards
