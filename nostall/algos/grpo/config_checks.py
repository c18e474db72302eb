"""GRPOConfig's checks of TRL's options: how a generation batch splits into micro-batches and
optimizer steps, the learning-rate schedule, LoRA, the sampler's filters and checkpoint
pruning. (Read from the config; config.py's `check` calls them.)"""

from __future__ import annotations

from pathlib import Path

from nostall.train.schedule import SCHEDULES


def check_trl_options(config) -> None:
    """ValueError naming the flag of a bad batch split, schedule, LoRA, sampling or
    checkpoint-pruning setting (TRL's options, read from `config`, a GRPOConfig)."""
    size = config.micro_batch_size
    if size is not None:
        if size < 1 or size % config.num_generations or config.batch_size % size:
            raise ValueError(
                f"--micro-batch-size {size} must be a multiple of "
                f"--num-generations {config.num_generations} dividing the batch "
                f"of {config.batch_size} completions"
            )
        if config.steps_per_generation not in (None, config.batch_size // size):
            raise ValueError(
                f"--micro-batch-size {size} and --steps-per-generation "
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
        if not config.checkpoint or "{step" not in Path(config.checkpoint).name:
            raise ValueError(
                "--save-total-limit needs --checkpoint with {step} in its "
                "file name (one file a save)"
            )
    if config.log_completions and not config.output_dir:
        raise ValueError("--log-completions writes into --output-dir: give one")
