"""LoRA through `peft`: the trainer trains low-rank adapters of the model's linear layers
while the model's own weights stay frozen, and the run saves the adapter (`peft`'s
`save_pretrained`, loadable with `PeftModel.from_pretrained` over the same base model)."""

from __future__ import annotations

import torch


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def apply_lora(model: torch.nn.Module, r: int, alpha: float,
               target_modules: str) -> torch.nn.Module:  # fmt: skip
    """`model` with LoRA adapters of rank `r` on `target_modules` ("all-linear", or names
    comma-separated: "q_proj,v_proj"); no dropout, so the trainer's log-probs are the
    generator's."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ValueError("--lora-r needs the peft package: pip install 'nostall[lora]'") from None
    targets = target_modules if target_modules == "all-linear" else [
        name.strip() for name in target_modules.split(",") if name.strip()
    ]  # fmt: skip
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets,
                        task_type="CAUSAL_LM")  # fmt: skip
    try:
        return get_peft_model(model, config)
    except ValueError as e:  # target modules the model does not have
        raise ValueError(f"--lora-target-modules {target_modules!r}: {e}") from None
