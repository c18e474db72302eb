"""LoRA through `peft`: the trainer trains low-rank adapters of the model's linear layers
while the model's own weights stay frozen, and the run saves the adapter (`peft`'s
`save_pretrained`, loadable with `PeftModel.from_pretrained` over the same base model)."""

from __future__ import annotations

import torch


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def apply_lora(
    model: torch.nn.Module, r: int, alpha: float, target_modules: str, seed: int = 0
) -> torch.nn.Module:
    """`model` with LoRA adapters of rank `r` on `target_modules` ("all-linear", or names
    comma-separated: "q_proj,v_proj"); no dropout, so the trainer's log-probs are the
    generator's. The adapters' initial weights are drawn from `seed` alone (not from whatever
    the process drew before), so a seed gives one run."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ValueError("--lora-r needs the peft package: pip install 'peft>=0.15'") from None
    targets = (
        target_modules
        if target_modules == "all-linear"
        else [name.strip() for name in target_modules.split(",") if name.strip()]
    )
    config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM"
    )
    try:
        # (manual_seed seeds every GPU too: the model's are forked with the host's)
        gpus = sorted({p.device.index or 0 for p in model.parameters() if p.is_cuda})
        with torch.random.fork_rng(devices=gpus):
            torch.manual_seed(seed)
            return get_peft_model(model, config)
    except ValueError as e:  # target modules the model does not have
        raise ValueError(f"--lora-target-modules {target_modules!r}: {e}") from None
