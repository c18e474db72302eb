"""The behaviour log-probs a generation side records and the trainer's from the same weights,
for the tests that hold them equal (top-k/top-p, min_p, architectures, LoRA)."""

import torch

from nostall.algos import grpo


def trainer_log_probs(setup, args, batch, decoder=None) -> torch.Tensor:
    """The trainer's log-probs of `batch`'s completion tokens (`decoder`: default the run's)."""
    with torch.no_grad():
        log_probs = grpo.policy_log_probs(
            decoder or setup.decoder, batch, args.temperature, setup.vocab, args.num_generations
        )
    return log_probs[batch.completion_mask]


def generated_and_trainer(setup, args):
    """(behaviour, trainer) log-probs of one freshly generated batch (the run's first slot),
    over its completion tokens."""
    batch = setup.loop.slots[0]
    setup.generator(batch)
    return batch.log_probs[batch.completion_mask], trainer_log_probs(setup, args, batch)
