"""GRPO's update split over data-parallel ranks (grpo_update's `rank`, what each FSDP2 rank of
`--trainers M` runs): each rank's share of every micro-batch, its loss weighted by
rank_weights, gives gradients whose mean over the ranks is the whole micro-batch's, for every
loss type (means over rows and over tokens), several micro-batches and optimizer steps a
batch, the decoupled objective, an entropy bonus and banned tokens. No process group here:
the ranks run one after the other on one model, and their gradients are averaged by hand."""

import pytest
import torch

from nostall.algos import grpo
from nostall.algos.grpo.loss import PolicyTerms
from nostall.algos.grpo.update import UpdateContext, grpo_update, rank_rows
from nostall.lm.batch import LMBatch
from nostall.lm.generation import SampledVocab
from tests.algos.grpo.test_explicit_update import _llama as _model  # (2 layers, grouped-query)

# float32: the same ops on fewer rows, summed in another order.
RTOL, ATOL = 1e-4, 1e-6


def _batch(Bp: int, G: int, P: int = 5, C: int = 6, seed: int = 0) -> LMBatch:
    """Completions of varied lengths: the ranks' shares hold different numbers of tokens."""
    g = torch.Generator().manual_seed(seed)
    batch = LMBatch.empty(Bp * G, P, C)
    batch.prompt_ids.copy_(torch.randint(3, 22, (Bp, P), generator=g).repeat_interleave(G, 0))
    batch.prompt_mask.fill_(True)
    batch.prompt_mask[:G, :2] = False
    batch.completion_ids.copy_(torch.randint(3, 22, (Bp * G, C), generator=g))
    lengths = torch.randint(1, C + 1, (Bp * G,), generator=g)
    batch.completion_mask.copy_(torch.arange(C)[None] < lengths[:, None])
    batch.loss_mask.copy_(batch.completion_mask)
    batch.log_probs.copy_(torch.rand(Bp * G, C, generator=g).log() - 1.0)
    batch.rewards.copy_(torch.rand(Bp * G, generator=g))
    return batch


def fsdp_args(device: str = "cpu") -> grpo.GRPOCommandConfig:
    """The FSDP2 test's run: token-mean loss over two micro-batches, one step each, decay and
    a gradient-norm clip that acts."""
    return grpo.GRPOCommandConfig(
        num_prompts=4,
        num_generations=3,
        loss_type="dapo",
        steps_per_generation=2,
        entropy_coef=0.05,
        learning_rate=1e-2,
        weight_decay=0.1,
        max_grad_norm=0.05,
        device=device,
    )


class Recorder:
    """The optimizer interface grpo_update steps, recording each step's gradients (and not
    stepping: every rank then sees the same weights)."""

    def __init__(self, model: torch.nn.Module):
        self.params = list(model.parameters())
        self.param_groups = [{"lr": 0.0}]
        self.steps: list[list[torch.Tensor]] = []

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def collect_gradients(self) -> None:
        pass

    def apply_gradients(self, measure: bool = False) -> None:
        self.steps.append(
            [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.params]
        )


def _gradients(model, args, batch, vocab, rank):
    recorder = Recorder(model)
    group_index = torch.arange(args.num_prompts).repeat_interleave(args.num_generations)
    grpo_update(
        UpdateContext(
            PolicyTerms(model), recorder, args, vocab, group_index, rank=rank, autograd=True
        ),
        batch,
        True,
    )
    return recorder.steps


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
@pytest.mark.parametrize("micro, accumulate", [(1, 1), (2, 1), (2, 2)])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.05])
def test_the_ranks_mean_gradient_is_the_whole_batchs(loss_type, micro, accumulate, entropy_coef):
    M, Bp, G = 2, 4, 3
    args = grpo.GRPOCommandConfig(
        num_prompts=Bp,
        num_generations=G,
        loss_type=loss_type,
        steps_per_generation=micro,
        gradient_accumulation_steps=accumulate,
        entropy_coef=entropy_coef,
        temperature=0.8,
    )
    model, batch = _model(), _batch(Bp, G)
    vocab = SampledVocab.build(22, [1, 2])
    whole = _gradients(model, args, batch, vocab, (0, 1))
    ranks = [_gradients(model, args, batch, vocab, (r, M)) for r in range(M)]
    assert len(whole) == micro // accumulate * args.updates_per_batch
    for step, expected in enumerate(whole):
        for i, grad in enumerate(expected):
            mean = sum(rank[step][i] for rank in ranks) / M
            torch.testing.assert_close(mean, grad, rtol=RTOL, atol=ATOL)


def test_a_ranks_rows_are_its_share_of_each_micro_batch():
    rows = torch.arange(12)
    assert rank_rows(rows, 2, (0, 2)).tolist() == [0, 1, 2, 6, 7, 8]
    assert rank_rows(rows, 2, (1, 2)).tolist() == [3, 4, 5, 9, 10, 11]
    assert rank_rows(rows, 1, (1, 3)).tolist() == [4, 5, 6, 7]
