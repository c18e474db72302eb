"""A few GRPO steps of the 135M-shaped model (benchmarks/lm/scale_grpo.py's) on a GPU, bf16
compute over float32 master weights: per-step time, peak device memory, and the host syncs
SyncWatch finds per decode step and per update (both should be 0). For the first machine with a
GPU; tools/gpu_check.sh runs it.

    python -m benchmarks.lm.gpu_step [--steps 6] [--new-tokens 64] [--dtype auto]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile

import torch

from benchmarks.lm.scale_grpo import GENERATIONS, PROMPTS, build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--staleness", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark is for a GPU machine")
    from nostall.algos import grpo

    with tempfile.TemporaryDirectory() as folder:
        build_model(folder, "135m")
        config = grpo.GRPOCommandConfig(
            model=folder,
            steps=args.steps,
            num_prompts=PROMPTS,
            num_generations=GENERATIONS,
            max_new_tokens=args.new_tokens,
            device="cuda",
            dtype=args.dtype,
            staleness=args.staleness,
            learning_rate=1e-6,
            log_interval=1,
        )
        trainer = grpo.GRPOTrainer(args=config)
        result = trainer.train()
    steps = [1e3 * (b - a) for a, b in itertools.pairwise(result.step_times)]
    dtype = trainer.setup.compute.get_input_embeddings().weight.dtype
    print(
        f"135M-shaped Llama on {torch.cuda.get_device_name()}, {dtype}, {PROMPTS} prompts x "
        f"{GENERATIONS} completions x {args.new_tokens} tokens, staleness {args.staleness}"
    )
    print(
        f"  step {statistics.median(steps):.0f} ms (median after the first; generation "
        f"{result.generation_ms:.0f}, update {result.update_ms:.0f})"
    )
    print(f"  peak device memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    print(
        f"  syncs per decode step {result.syncs_per_decode_step}, per update "
        f"{result.syncs_per_update}"
    )
    print(
        f"  behaviour log-probs within "
        f"{result.metrics.get('sampling/sampling_logp_difference/max', float('nan')):.3g} of "
        f"the trainer's"
    )
    bad = (result.syncs_per_decode_step or 0) + (result.syncs_per_update or 0)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
