"""GRPOConfig's checks of TRL's options: how a generation batch splits into micro-batches and
optimizer steps, the learning-rate schedule, LoRA, the sampler's filters and checkpoint
pruning. (Read from the config; config.py's `check` calls them.)"""

from __future__ import annotations

import math
from pathlib import Path

from nostall.lm.precision import DTYPES, MASTER_DTYPES
from nostall.ops.losses import GROUP_SCALES
from nostall.train.reporters import requested
from nostall.train.schedule import SCHEDULES

# TRL's vllm_importance_sampling_mode values: the ratio of each token or of the completion,
# clamped to its bounds (truncate) or zeroed outside them (mask).
BEHAVIOUR_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# transformers' optimizers that are Adam with decoupled weight decay: nostall's ClippedAdam.
ADAMW = ("adamw_torch_fused", "adamw_torch", "adamw_hf", "adamw")


def check_trl_options(config) -> None:
    """ValueError naming the flag of a bad batch split, schedule, LoRA, sampling or
    checkpoint-pruning setting (TRL's options, read from `config`, a GRPOConfig)."""
    size = config.per_device_train_batch_size
    if size is not None:
        if size < 1 or size % config.num_generations or config.batch_size % size:
            raise ValueError(
                f"--per-device-train-batch-size {size} must be a multiple of "
                f"--num-generations {config.num_generations} dividing the batch "
                f"of {config.batch_size} completions"
            )
        if config.steps_per_generation not in (None, config.batch_size // size):
            raise ValueError(
                f"--per-device-train-batch-size {size} and --steps-per-generation "
                f"{config.steps_per_generation} disagree: give one"
            )
    micro = config.micro_batches
    if micro < 1:
        raise ValueError(f"--steps-per-generation must be at least 1, got {micro}")
    if micro % config.gradient_accumulation_steps:
        raise ValueError(
            f"--steps-per-generation {micro} must be a multiple of "
            "--gradient-accumulation-steps "
            f"{config.gradient_accumulation_steps}"
        )
    if config.num_prompts % micro:
        raise ValueError(
            f"--num-prompts {config.num_prompts} must split into {micro} "
            "micro-batches of whole prompt groups (a multiple of "
            "--steps-per-generation)"
        )
    if config.lr_scheduler_type not in SCHEDULES:
        raise ValueError(
            f"--lr-scheduler-type must be one of {', '.join(SCHEDULES)}, got "
            f"{config.lr_scheduler_type!r}"
        )
    if not 0 <= config.warmup_ratio <= 1:
        raise ValueError(f"--warmup-ratio must lie in [0, 1], got {config.warmup_ratio}")
    if config.warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be >= 0, got {config.warmup_steps}")
    if not 0 <= config.weight_decay < float("inf"):
        raise ValueError(f"--weight-decay must be a finite number >= 0, got {config.weight_decay}")
    if config.lora_r and not 0 < config.lora_alpha < float("inf"):
        raise ValueError(f"--lora-alpha must be a positive finite number, got {config.lora_alpha}")
    if not 0 <= config.min_p < 1:
        raise ValueError(f"--min-p must lie in [0, 1), got {config.min_p}")
    if not 0 < config.repetition_penalty < float("inf"):
        raise ValueError(
            f"--repetition-penalty must be a positive finite number, got "
            f"{config.repetition_penalty}"
        )
    if config.save_total_limit is not None:
        if config.save_total_limit < 1:
            raise ValueError(
                f"--save-total-limit must be at least 1, got {config.save_total_limit}"
            )
        folders = config.save_strategy != "no" and config.output_dir
        if config.checkpoint and "{step" not in Path(config.checkpoint).name:
            raise ValueError(
                "--save-total-limit needs --checkpoint with {step} in its "
                "file name (one file a save)"
            )
        if not config.checkpoint and not folders:
            raise ValueError(
                "--save-total-limit needs checkpoints: --checkpoint with {step} in its file "
                "name, or save_strategy with an output_dir"
            )
    check_trl_run(config)
    if config.log_completions and not config.output_dir:
        raise ValueError("--log-completions writes into --output-dir: give one")


def check_trl_run(config) -> None:
    """ValueError naming a bad value of TRL's run settings: length, optimizer, precision,
    checkpoint folders, evaluation and reporting."""
    if config.steps is not None and config.max_steps > 0:
        raise ValueError(f"--steps {config.steps} and --max-steps {config.max_steps}: give one")
    if not 0 < config.num_train_epochs < float("inf"):
        raise ValueError(
            f"--num-train-epochs must be a positive finite number, got {config.num_train_epochs}"
        )
    if config.optim not in ADAMW:
        raise ValueError(
            f"--optim {config.optim!r}: nostall's optimizer is AdamW (fused); give one of "
            f"{', '.join(ADAMW)}"
        )
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must lie in [0, 1)")
    if not 0 < config.adam_epsilon < float("inf"):
        raise ValueError(
            f"--adam-epsilon must be a positive finite number, got {config.adam_epsilon}"
        )
    if config.fp16:
        raise ValueError("--fp16: nostall computes in bfloat16 or float32; use bf16=True")
    if config.save_strategy not in ("steps", "epoch", "no"):
        raise ValueError(
            f"--save-strategy must be steps, epoch or no, got {config.save_strategy!r}"
        )
    if config.eval_strategy not in ("steps", "epoch", "no"):
        raise ValueError(
            f"--eval-strategy must be steps, epoch or no, got {config.eval_strategy!r}"
        )
    for name in ("save_steps", "eval_steps", "num_generations_eval", "per_device_eval_batch_size"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    try:
        requested(config.report_to)
    except ValueError as e:
        raise ValueError(f"--{e}".replace("report_to", "report-to", 1)) from None


def check_settings(config) -> None:
    """ValueError naming the flag of a GRPO setting out of its range: counts, caps, sampling,
    the loss's coefficients, precision, rewards' scaling (read from `config`, a GRPOConfig)."""
    if config.steps is not None and config.steps < 1:
        raise ValueError(f"--steps must be at least 1, got {config.steps}")
    for name in (
        "num_prompts",
        "max_new_tokens",
        "updates_per_batch",
        "gradient_accumulation_steps",
    ):
        if getattr(config, name) < 1:
            raise ValueError(f"--{flag(name)} must be at least 1, got {getattr(config, name)}")
    if config.num_generations < 2:
        raise ValueError(
            f"--num-generations must be at least 2 (a group of one has no relative "
            f"advantage), got {config.num_generations}"
        )
    caps = (
        ("num_prompts", 1 << 16),
        ("num_generations", 1 << 12),
        ("max_new_tokens", 1 << 20),
        ("updates_per_batch", 1 << 10),
        ("staleness", 64),
    )
    for name, cap in caps:
        if getattr(config, name) > cap:
            raise ValueError(f"--{flag(name)} must be at most {cap}, got {getattr(config, name)}")
    if config.batch_size > 1 << 20:
        raise ValueError(f"--num-prompts * --num-generations must be at most {1 << 20}")
    for name in ("staleness", "top_k", "stop_check_every", "lora_r"):
        if not getattr(config, name) >= 0:
            raise ValueError(f"--{flag(name)} must be >= 0, got {getattr(config, name)}")
    for name in (
        "learning_rate",
        "max_grad_norm",
        "temperature",
        "reward_timeout",
        "generation_timeout",
    ):
        value = getattr(config, name)
        if not (value > 0 and value < float("inf")):
            raise ValueError(f"--{flag(name)} must be a positive finite number, got {value}")
    check_behaviour_weight(config)
    if not 0 < config.top_p <= 1:
        raise ValueError(f"--top-p must lie in (0, 1], got {config.top_p}")
    for name in ("clip_low", "clip_high", "beta", "entropy_coef"):
        value = getattr(config, name)
        if value is not None and not 0 <= value < float("inf"):
            raise ValueError(f"--{flag(name)} must be a finite number >= 0, got {value}")
    if not -float("inf") < config.target_reward < float("inf"):
        raise ValueError(f"--target-reward must be finite, got {config.target_reward}")
    if config.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
    if config.master_dtype not in MASTER_DTYPES:
        raise ValueError(
            f"--master-dtype must be {' or '.join(MASTER_DTYPES)}, got {config.master_dtype!r}"
        )
    if config.master_dtype == "bfloat16" and config.dtype == "float32":
        raise ValueError("--master-dtype bfloat16 computes in bf16: drop --dtype float32")
    if config.gradient_checkpointing and config.lora_r:
        # (Checkpointing's training mode turns off the KV cache the adapters' generation,
        # through the model's own forward, decodes from.)
        raise ValueError(
            "--gradient-checkpointing with LoRA adapters (--lora-r) is not supported: give one"
        )
    if config.scale_rewards not in GROUP_SCALES:
        raise ValueError(
            f"--scale-rewards must be group, batch or none, got {config.scale_rewards!r}"
        )


def check_behaviour_weight(config) -> None:
    """The behaviour weight's mode and bounds (TRL's vllm_importance_sampling_*)."""
    mode = config.vllm_importance_sampling_mode
    if mode not in BEHAVIOUR_MODES:
        raise ValueError(
            f"--vllm-importance-sampling-mode must be one of {', '.join(BEHAVIOUR_MODES)}, "
            f"got {mode!r}"
        )
    low, high = config.vllm_importance_sampling_clip_min, config.is_cap
    if high is not None and not (high > 0 and high < float("inf")):  # (None: no bound)
        raise ValueError(f"--is-cap must be a positive finite number, got {high}")
    if low is not None and not 0 <= low < float("inf"):
        raise ValueError(
            f"--vllm-importance-sampling-clip-min must be a finite number >= 0, got {low}"
        )
    if low is not None and high is not None and low > high:
        raise ValueError(
            f"--vllm-importance-sampling-clip-min {low} must be at most --is-cap {high}"
        )


def reward_weights(weights) -> list[float] | None:
    """reward_weights as numbers (a list, or the command's "1,0.5"); ValueError for a weight
    that is not a finite number."""
    if weights is None:
        return None
    try:
        values = [float(w) for w in (weights.split(",") if isinstance(weights, str) else weights)]
    except (TypeError, ValueError):
        raise ValueError(f"--reward-weights must be numbers, got {weights!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"--reward-weights must be finite numbers, got {weights!r}")
    return values


def flag(name: str) -> str:
    return name.replace("_", "-")
