"""Prints docs/from_trl.md's table: every field of the installed TRL's GRPOConfig and what
nostall's GRPOConfig does with it (run where TRL is installed; the doc's test checks that every
field is listed)."""

import dataclasses

from trl import GRPOConfig as TRLConfig

from nostall.algos.grpo import GRPOConfig, trl_names
from nostall.algos.grpo.config import ALIASES

# Fields nostall takes by name whose meaning or default differs somewhere: what differs.
DIFFERS = {
    "learning_rate": "TRL's 1e-6 for a model directory or object; 1.1e-3 for nostall's "
    "built-in toy models",
    "max_completion_length": "TRL's 512 for a real model (cut to its context); 5 for the "
    "built-in toy models",
    "gradient_checkpointing": "TRL's default (on) for a real model, through the model's own "
    "forward; off: nostall's native decoder (the command's default); off with LoRA "
    "adapters (refused together) and for built-in models",
    "min_p": "None and 0.0 both mean no filter",
    "bf16": 'None: `dtype` decides ("auto": bf16 where the hardware has it, for a real model)',
    "output_dir": "TRL's `trainer_output` when not given; nostall also writes its report, "
    "plots and `model/` there",
    "report_to": "none, tensorboard, and wandb or trackio where installed (a named error "
    "otherwise); the command's default is tensorboard",
    "optim": "every AdamW name is nostall's fused AdamW; others refused",
    "fp16": "True refused: bf16=True",
    "loss_type": "grpo, bnpo, dapo, dr_grpo; cispo, sapo, luspo, vespo refused",
    "save_strategy": "steps, epoch, no (best refused); folders hold nostall's resume state too",
    "eval_strategy": "steps, epoch, no; the evaluation runs beside training (eval_overlap)",
    "scale_rewards": "group, batch, none (True, False: group, none)",
    "entropy_coef": "the same bonus; the command's default is 0.05",
    "num_train_epochs": "TRL's count; a batch may hold the last prompts of one epoch and the "
    "first of the next",
    "vllm_importance_sampling_mode": "TRL's four modes, applied wherever generation's "
    "policy can differ from the trainer's (staleness >= 1, bf16 compute, vLLM); the command's "
    "default is token_truncate",
    "vllm_importance_sampling_clip_max": "as `is_cap`; None keeps the default (no upper bound: "
    "is_cap=None); the command's default is 2.0",
}


def main() -> None:
    own = {f.name for f in dataclasses.fields(GRPOConfig)}
    print("| TRL field | nostall |")
    print("|---|---|")
    for f in dataclasses.fields(TRLConfig):
        name = f.name
        if name in ALIASES and name in DIFFERS:
            status = f"different: {DIFFERS[name]}"
        elif name in ALIASES:
            status = f"same meaning and default, as `{ALIASES[name]}`"
        elif name in own:
            same = "same meaning and default"
            status = f"different: {DIFFERS[name]}" if name in DIFFERS else same
        elif name in trl_names.INERT:
            status = f"accepted, no effect: {trl_names.INERT[name]}"
        elif name in trl_names.DEFAULT_ONLY:
            default, instead = trl_names.DEFAULT_ONLY[name]
            status = f"TRL's default ({default!r}) only; other values refused: use {instead}"
        else:
            status = "**unknown** (refused with the closest names)"
        print(f"| `{name}` | {status} |")


if __name__ == "__main__":
    main()
