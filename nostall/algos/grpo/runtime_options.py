"""The checks of where a GRPO run generates and how: the backend, its workers, in-flight
weights and the generator (native or vLLM), each naming the flags that clash."""

from __future__ import annotations

import torch

GENERATORS = ("native", "vllm")


def check_runtime(config, device: torch.device) -> None:
    """ValueError naming the flag for a runtime setting `config` (a GRPOConfig) cannot run
    (after RunConfig.check_run: the backend, workers, weights and ranks each make sense)."""
    if config.backend == "process" and device.type != "cpu":
        raise ValueError(
            f"--backend process generates on the CPU; with --device "
            f"{config.device} use --backend thread or ray"
        )
    _check_worker_gpus(config, device)
    _check_trainers(config)
    if config.backend == "ray" and config.inflight_weights:
        raise ValueError(
            "--inflight-weights is not available with --backend ray (a worker "
            "takes new weights between batches)"
        )
    if config.inflight_weights and config.staleness < 1:
        raise ValueError(
            "--inflight-weights needs --staleness of at least 1 (at staleness 0 "
            "no weights are published while a batch is generated)"
        )
    _check_generator(config)


def worker_gpus(config, device: torch.device) -> float:
    """The GPUs a Ray generation worker reserves: --gpus-per-worker, or one a worker on a GPU
    run (Ray hides the GPUs from an actor that reserves none)."""
    if config.gpus_per_worker is not None:
        return config.gpus_per_worker
    return 1.0 if device.type == "cuda" else 0.0


def _check_worker_gpus(config, device: torch.device) -> None:
    gpus = config.gpus_per_worker
    if gpus is not None and not 0 <= gpus < float("inf"):
        raise ValueError(f"--gpus-per-worker must be a finite number >= 0, got {gpus}")
    if config.backend == "ray" and device.type == "cuda" and worker_gpus(config, device) == 0:
        raise ValueError(
            "--device cuda with --backend ray generates on the workers' GPUs: "
            "--gpus-per-worker must be above 0 (a Ray actor that reserves no GPU "
            "sees none)"
        )


def _check_trainers(config) -> None:
    if config.trainers == 1:
        return
    if config.micro_batches < 1:
        return  # (named by the micro-batch checks)
    groups = config.num_prompts // config.micro_batches
    if groups % config.trainers:
        raise ValueError(
            f"--trainers {config.trainers} must divide the {groups} prompt groups "
            "of a micro-batch (each rank trains on whole groups): change "
            "--num-prompts or --steps-per-generation"
        )


def _check_generator(config) -> None:
    if config.generator not in GENERATORS:
        raise ValueError(f"--generator must be native or vllm, got {config.generator!r}")
    if not 0 < config.vllm_gpu_memory_utilization <= 1:
        raise ValueError(
            "--vllm-gpu-memory-utilization must lie in (0, 1], got "
            f"{config.vllm_gpu_memory_utilization}"
        )
    if config.generator != "vllm":
        return
    if config.inflight_weights:
        raise ValueError(
            "--generator vllm takes new weights between batches, not between "
            "decode steps: drop --inflight-weights"
        )
    if config.lora_r:
        raise ValueError(
            "--generator vllm does not take LoRA adapters yet: drop --lora-r, or "
            "generate with --generator native"
        )
