"""vLLM as nostall's generator, against nostall's own engine and TRL's GRPOTrainer, at the 135M
shape with 256-token completions (benchmarks/lm/scale_grpo.py's model, with a tokenizer of its
whole vocabulary so every side runs its completions to full length), 4 prompts x 4
completions, at staleness 0 (TRL's generate-then-train loop, its settings) and at nostall's
defaults (staleness 1). Each side in a fresh process; the vLLM sides in the venv vLLM is
installed in (`make test-vllm` builds it), the others in this one. Per step (median after the
first) and in completion tokens a second.

    python -m benchmarks.lm.vllm_grpo [--steps 4] [--new-tokens 256] [--sides ...]
        [--vllm-python .venv-vllm/bin/python]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.lm.scale_grpo import GENERATIONS, PROMPTS, build_model, run_nostall, run_trl

ROOT = Path(__file__).resolve().parent.parent.parent
SIDES = ("native_s0", "vllm_s0", "native_default", "vllm_default", "trl_bf16")


def child(side: str, folder: str, steps: int, threads: int, new_tokens: int) -> dict:
    if side == "trl_bf16":
        return run_trl(folder, steps, threads, torch.bfloat16, new_tokens)
    generator, setting = side.split("_")
    return run_nostall(folder, steps, threads, f"nostall_{setting}", new_tokens, generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args.child, args.folder, args.steps, args.threads, args.new_tokens)
        print(json.dumps(result))
        return
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        build_model(folder, "135m", whole_vocab=True)
        for side in args.sides.split(","):
            python = args.vllm_python if side.startswith("vllm") else sys.executable
            run = subprocess.run(
                [
                    python,
                    "-m",
                    "benchmarks.lm.vllm_grpo",
                    "--child",
                    side,
                    "--folder",
                    folder,
                    "--steps",
                    str(args.steps),
                    "--threads",
                    str(args.threads),
                    "--new-tokens",
                    str(args.new_tokens),
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            if run.returncode != 0:
                print(f"{side}: failed\n{run.stderr[-2000:]}")
                continue
            results[side] = json.loads(run.stdout.strip().splitlines()[-1])
    print(
        f"135M-shaped Llama, {PROMPTS} prompts x {GENERATIONS} completions x up to "
        f"{args.new_tokens} tokens, {args.threads} threads; a step (median after the "
        "first), completion tokens/s, peak RSS"
    )
    medians = {}
    for side, result in results.items():
        ms = medians[side] = statistics.median(result["step_ms"])
        length = result.get("mean_length") or float("nan")
        tokens_s = PROMPTS * GENERATIONS * length / (ms / 1e3)
        extra = ""
        if "generation_ms" in result:
            extra = (
                f"   generation {result['generation_ms']:.0f} ms, update "
                f"{result['update_ms']:.0f} ms"
            )
            if result.get("weight_push_ms") is not None:
                extra += f", weight push {result['weight_push_ms']:.0f} ms"
        print(
            f"  {side:15s} {ms:8.0f} ms  {tokens_s:7.1f} tok/s  (mean length {length:.0f})  "
            f"peak {result['peak_mib']:6.0f} MiB{extra}"
        )
    pairs = [
        ("native_s0", "vllm_s0"),
        ("native_default", "vllm_default"),
        ("trl_bf16", "vllm_s0"),
        ("trl_bf16", "vllm_default"),
        ("trl_bf16", "native_s0"),
        ("trl_bf16", "native_default"),
    ]
    for theirs, mine in pairs:
        if theirs in medians and mine in medians:
            print(f"  {theirs} / {mine}: {medians[theirs] / medians[mine]:.2f}x per step")


if __name__ == "__main__":
    main()
