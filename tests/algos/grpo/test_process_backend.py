"""GRPO with generation in a process of its own (`backend="process"`, nostall/runtime/
process_loop.py): the same run as the thread backend at staleness 0, bit for bit; exact resume
from the k-th checkpoint, also from a checkpoint the thread backend wrote; queued batches
restored at staleness 1; the generation side's figures and in-flight swaps cross the process
boundary; a reward that raises in the child stops the run with its traceback; no child is left."""

import dataclasses

import pytest
import torch
import torch.multiprocessing as mp

import nostall
from nostall.algos import grpo

# Staleness 0 unless a test says otherwise: bit-for-bit comparisons need the synchronous run.
FAST = dict(
    steps=6, num_prompts=4, num_generations=4, watch_syncs=False, log_interval=2, staleness=0
)


def _parameters(setup) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in setup.lm.model.state_dict().items()}


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_staleness_zero_matches_the_thread_backend_bit_for_bit():
    args = grpo.GRPOCommandConfig(**FAST)
    thread = grpo.build(args)
    expected = grpo.train(args, setup=thread)
    process_args = dataclasses.replace(args, backend="process")
    process = grpo.build(process_args)
    result = grpo.train(process_args, setup=process)
    assert result.rewards == expected.rewards
    assert _same(_parameters(process), _parameters(thread))
    assert mp.active_children() == []


@pytest.mark.parametrize("k", [2, 4])
def test_resume_from_the_kth_checkpoint_is_exact(tmp_path, k):
    """Written by the thread backend, resumed on the process backend: the same run."""
    args = grpo.GRPOCommandConfig(
        **dict(FAST, steps=8), checkpoint=str(tmp_path / "ckpt-{step}.pt"), checkpoint_every=2
    )
    full = grpo.build(args)
    result = grpo.train(args, setup=full)
    resumed_args = dataclasses.replace(
        args,
        backend="process",
        resume=str(tmp_path / f"ckpt-{k}.pt"),
        checkpoint=str(tmp_path / "again-{step}.pt"),
    )
    resumed = grpo.build(resumed_args)
    again = grpo.train(resumed_args, setup=resumed)
    assert again.rewards == result.rewards
    assert _same(_parameters(full), _parameters(resumed))
    # And the process backend's own checkpoints resume exactly (on the thread backend here).
    back_args = dataclasses.replace(args, resume=str(tmp_path / "again-6.pt"), checkpoint=None)
    back = grpo.build(back_args)
    assert grpo.train(back_args, setup=back).rewards == result.rewards
    assert _same(_parameters(full), _parameters(back))


def test_resume_with_staleness_restores_the_queued_batches(tmp_path):
    args = grpo.GRPOCommandConfig(
        **dict(FAST, staleness=1),
        backend="process",
        checkpoint=str(tmp_path / "c-{step}.pt"),
        checkpoint_every=3,
    )
    first = grpo.train(args)
    resumed = grpo.train(
        dataclasses.replace(args, resume=str(tmp_path / "c-3.pt"), checkpoint=None)
    )
    # The batch trained on right after the checkpoint was generated before it: restored.
    assert resumed.rewards[:4] == first.rewards[:4]
    assert len(resumed.rewards) == args.steps


def test_the_generation_sides_figures_cross_the_process_boundary():
    args = grpo.GRPOCommandConfig(
        **dict(FAST, watch_syncs=True, staleness=1), backend="process", inflight_weights=True
    )
    result = grpo.train(args)
    assert result.syncs_per_decode_step == 0, result.sync_sites  # measured in the child
    assert result.syncs_per_update == 0, result.sync_sites
    assert 0 <= result.mean_token_lag <= result.mean_lag <= 1
    assert len(result.rewards) == args.steps and result.tokens > 0


def _reward_raises(prompts, completions, **kw):
    raise RuntimeError("the reward server is down")


def test_a_reward_that_raises_in_the_child_stops_the_run_with_its_traceback():
    reward = "tests.algos.grpo.test_process_backend:_reward_raises"
    args = grpo.GRPOCommandConfig(**dict(FAST, reward=reward), backend="process")
    with pytest.raises(nostall.runtime.RuntimeStopped, match="the reward server is down") as info:
        grpo.train(args)
    assert "Traceback" in str(info.value) and "_reward_raises" in str(info.value)
    assert mp.active_children() == []


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(backend="mpi"), "--backend must be thread, process or ray"),
        (dict(backend="process", device="cuda"), "--backend process generates on the CPU|no CUDA"),
    ],
)
def test_bad_backend_arguments_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        grpo.GRPOCommandConfig(**FAST, **change).check()
