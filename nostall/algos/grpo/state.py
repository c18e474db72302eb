"""A GRPO run's checkpoint state (as PPO's state.py): what a checkpoint holds of the model, the
optimizer, the rollout loop and its generator, and the run's per-step figures; restoring it into
a freshly built run; and the trained model saved as transformers saves one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from nostall.algos.grpo.result import GRPOResult
from nostall.algos.grpo.setup import Setup
from nostall.lm.batch import LMBatch


def snapshot(setup: Setup, step: int, result: GRPOResult) -> dict:
    """Taken inside the loop's boundary, after the step's publish, and saved there: the
    tensors are the live ones (no copy), still for the block."""
    state = {
        "model": {k: v.detach() for k, v in setup.lm.model.state_dict().items()},
        "optimizer": setup.optimizer.state_dict(),
        "optimizer_parameters": _optimizer_names(setup),
        "loop": setup.loop.state_dict(LMBatch.state_dict),
        **setup.loop.fill_state(),  # the generator's sampling and prompt streams
        "step": step,
        "rewards": list(result.rewards),
        "step_times": list(result.step_times),
    }
    if setup.reference is not None:
        state["reference"] = setup.reference.model.state_dict()
    return state


def _optimizer_names(setup: Setup) -> list[str]:
    """The parameters' names in the optimizer's order."""
    names = {id(p): name for name, p in setup.lm.model.named_parameters()}
    return [names[id(p)] for p in setup.optimizer.parameters_in_order]


def _reordered(setup: Setup, state: dict) -> dict:
    """The checkpoint's optimizer state, its entries in this optimizer's order: a checkpoint
    names its order (older ones kept model.named_parameters()'s), and the moments of one
    parameter must not be loaded into another's of the same size."""
    saved = state.get("optimizer_parameters")
    if saved is None:
        saved = [name for name, _ in setup.lm.model.named_parameters()]
    current = _optimizer_names(setup)
    optimizer = state["optimizer"]
    if saved == current:
        return optimizer
    if sorted(saved) != sorted(current):
        raise ValueError("the checkpoint's optimizer holds other parameters than this model's")
    where = {name: index for index, name in enumerate(saved)}
    entries = optimizer["state"]
    moved = {i: entries[where[name]] for i, name in enumerate(current) if where[name] in entries}
    return {**optimizer, "state": moved}


def restore(setup: Setup, state: dict, result: GRPOResult) -> int:
    model = setup.lm.model
    with torch.no_grad():
        for name, value in model.state_dict().items():
            value.copy_(state["model"][name])
    setup.optimizer.load_state_dict(_reordered(setup, state))
    if setup.precision is not None:
        setup.precision.pull_all()
    setup.loop.load_state_dict(state["loop"], setup.compute, LMBatch.load_state_dict)
    setup.loop.load_fill_state({"generator": state["generator"], "prompts": state["prompts"]})
    if setup.reference is not None:  # (loaded into the reference's dtype)
        setup.reference.model.load_state_dict(state["reference"])
    result.rewards = list(state["rewards"])
    result.step_times = list(state["step_times"])
    return int(state["step"])


def save_model(setup: Setup, out_dir) -> None:
    """The trained model and its tokenizer, loadable with transformers' from_pretrained,
    written beside out_dir and renamed into place: a failed write (a full disk) leaves no
    folder that looks like a model, and the one there before, if any, intact."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.writing-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model = setup.lm.model
        # The optimizer keeps parameters as views of one flat buffer: save standalone copies.
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.save_pretrained(staging, state_dict=state)
        setup.lm.tokenizer.save_pretrained(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out_dir.exists():  # the previous model goes only once the new one is whole
        previous = out_dir.with_name(f".{out_dir.name}.previous-{os.getpid()}")
        out_dir.rename(previous)
        staging.rename(out_dir)
        shutil.rmtree(previous, ignore_errors=True)
    else:
        staging.rename(out_dir)
