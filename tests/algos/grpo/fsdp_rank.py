"""One rank of the FSDP2 gradient test (test_grpo_fsdp.py), run as its own process:
`python -m tests.algos.grpo.fsdp_rank RANK WORLD ADDRESS OUT TIED DEVICE` shards the test model over
the ranks (gloo on "cpu"; NCCL on "cuda", a GPU a rank), runs one update without stepping
(recording the averaged gradients, whole) and two real steps, and rank 0 saves what it saw in
OUT."""

import dataclasses
import sys

import torch
import torch.distributed as dist

from nostall.algos.grpo.sharded import RankUpdate, ShardedTrainer
from nostall.runtime import distributed
from tests.algos.grpo.test_rank_shares import _batch, _model, fsdp_args


def main(rank: int, world: int, address: str, out: str, tied: bool, device: str) -> None:
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    distributed.join(address, rank, world, "nccl" if device == "cuda" else "gloo")
    args = fsdp_args(device)
    update = RankUpdate(torch.float32, vocab=None, eos_token_id=None, decoupled=True)
    trainer = ShardedTrainer(
        _model(tied).to(device), args, rank, world, update, torch.device(device)
    )
    step = trainer.optimizer.apply_gradients
    recorded = []
    trainer.optimizer.apply_gradients = lambda measure=False: recorded.append(
        {name: p.grad.full_tensor() for name, p in trainer.named}
    )
    trainer.update(
        _on(_batch(args.num_prompts, args.num_generations), device), lr=args.learning_rate
    )
    trainer.optimizer.apply_gradients = step
    for seed in (1, 2):
        batch = _on(_batch(args.num_prompts, args.num_generations, seed=seed), device)
        metrics = trainer.update(batch, lr=args.learning_rate)
    weights, state = trainer.full_weights(), trainer.full_optimizer_state()
    if rank == 0:
        saved = {
            "gradients": recorded,
            "weights": weights,
            "optimizer": state,
            "loss": metrics["loss"],
        }
        torch.save(_to_host(saved), out)
    # Both ranks leave together: rank 0 holds the store, and a rank tearing down its group
    # while the other is still saving has aborted the process ("terminate called without an
    # active exception", once in many runs).
    dist.barrier()
    dist.destroy_process_group()


def _on(batch, device: str):
    return dataclasses.replace(batch, **{k: v.to(device) for k, v in batch.tensors().items()})


def _to_host(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_host(v) for v in value]
    return value


if __name__ == "__main__":
    main(
        int(sys.argv[1]),
        int(sys.argv[2]),
        sys.argv[3],
        sys.argv[4],
        sys.argv[5] == "1",
        sys.argv[6],
    )
