"""GRPO's FSDP2 trainer ranks (nostall/algos/grpo/sharded.py), two processes joined by gloo on
the CPU (and, marked gpu, by NCCL on two GPUs): the gradients FSDP averages over the ranks are
the single rank's on the same batch (each step of a batch of two micro-batches, a token-mean
loss and an entropy bonus, the output weight tied to the embeddings or not), and two real
steps (decay, a clip that acts, AdamW) leave the single rank's ClippedAdam's weights and
moments."""

import socket
import subprocess
import sys

import pytest
import torch

from nostall.algos.grpo.loss import PolicyTerms
from nostall.algos.grpo.update import UpdateContext, grpo_update
from nostall.optim import ClippedAdam
from tests.algos.grpo.test_rank_shares import Recorder, _batch, _model, fsdp_args

RTOL, ATOL = 1e-4, 1e-6
# Adam's step is the gradient over its own running scale: for an element whose gradients are
# near zero the rounding of the reduction moves it by up to a fraction of the learning rate.
WEIGHT_ATOL = 1e-2 * fsdp_args().learning_rate
ROOT = __file__.rsplit("/tests/", 1)[0]


def free_port() -> int:
    """A port free now (the ranks are separate processes started with its address; in a run,
    rank 0 listens before the others are given it: distributed.open_store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sharded_run(tmp_path, tied: bool, device: str = "cpu") -> dict:
    out = tmp_path / "rank0.pt"
    address = f"tcp://127.0.0.1:{free_port()}"
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.algos.grpo.fsdp_rank",
                str(r),
                "2",
                address,
                str(out),
                str(int(tied)),
                device,
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for rank in ranks:
        _, err = rank.communicate(timeout=240)
        assert rank.returncode == 0, err[-3000:]
    return torch.load(out)


@pytest.mark.parametrize(
    "tied, device",
    [
        (False, "cpu"),
        (True, "cpu"),
        pytest.param(
            True,
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(
                    torch.cuda.device_count() < 2,
                    reason="FSDP2 over NCCL needs two CUDA devices (a GPU a rank)",
                ),
            ],
        ),
    ],
)
def test_fsdp_ranks_average_to_the_single_ranks_gradient_and_step(tmp_path, tied, device):
    """On "cuda" the ranks shard over NCCL, a GPU each; the single rank stays on the CPU."""
    sharded = _sharded_run(tmp_path, tied, device)
    args = fsdp_args()
    group_index = torch.arange(args.num_prompts).repeat_interleave(args.num_generations)
    model = _model(tied)
    names = [name for name, _ in model.named_parameters()]
    recorder = Recorder(model)
    grpo_update(
        UpdateContext(PolicyTerms(model), recorder, args, None, group_index, autograd=True),
        _batch(args.num_prompts, args.num_generations),
        True,
    )
    assert len(sharded["gradients"]) == len(recorder.steps) == 2
    for got, expected in zip(sharded["gradients"], recorder.steps, strict=True):
        assert sorted(got) == sorted(names)
        for name, grad in zip(names, expected, strict=True):
            torch.testing.assert_close(got[name], grad, rtol=RTOL, atol=ATOL)
    optimizer = ClippedAdam(
        model.parameters(),
        lr=args.learning_rate,
        max_grad_norm=args.max_grad_norm,
        weight_decay=args.weight_decay,
    )
    for seed in (1, 2):
        grpo_update(
            UpdateContext(PolicyTerms(model), optimizer, args, None, group_index, autograd=True),
            _batch(args.num_prompts, args.num_generations, seed=seed),
            True,
        )
    for name, param in model.named_parameters():
        torch.testing.assert_close(
            sharded["weights"][name], param.detach(), rtol=RTOL, atol=WEIGHT_ATOL
        )
    state = optimizer.state_dict()["state"]
    for index, name in enumerate(names):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                sharded["optimizer"][name][key], state[index][key], rtol=1e-3, atol=1e-7
            )
        assert float(sharded["optimizer"][name]["step"]) == float(state[index]["step"]) == 4
