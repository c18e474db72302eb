"""GRPO at the shape of a model users train: a SmolLM2-135M-shaped Llama (30 layers, hidden
576, 9 heads / 3 key-value heads, intermediate 1536, vocabulary 49,152, tied embeddings; random
init, saved with save_pretrained beside the built-ins' character tokenizer), the copy task,
4 prompts x 4 completions of 8 tokens, against TRL's GRPOTrainer in its fastest CPU
configuration (the model loaded in bfloat16) and in float32. Each side in a fresh process;
per-step time (after the first step), peak memory, and the floor: the time of the step's
matrix products at that shape and precision on this machine.

    python -m benchmarks.lm.scale_grpo [--steps 8] [--threads 2] [--sides ...]
        [--shape 135m|small|tiny] [--max-new-tokens 8]

At --max-new-tokens past 8 the tokenizer holds the whole vocabulary, so completions run to their
full length on every side; the floor grows with the length by the decode steps' cache reads (at
this machine's measured bandwidth) and the update's attention (at its products' rate).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

PROMPTS, GENERATIONS, NEW_TOKENS = 4, 4, 8
SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
# nostall at --dtype auto (bf16 compute over float32 master weights where the CPU has bf16
# arithmetic), at float32, and all in bf16 (--master-dtype bfloat16, TRL's bf16 weights'
# counterpart); TRL with its weights in bf16 (its fastest here) and in float32.
SIDES = (
    "nostall_s0",
    "nostall_default",
    "nostall_fp32_s0",
    "nostall_bf16w_s0",
    "trl_bf16",
    "trl_fp32",
)


def shape_of(name: str) -> dict:
    """The model's config: the 135M shape (a Llama), or a built-in size (`small`, `tiny`: the
    built-ins' Qwen2 over the character tokenizer) for the sizes in between."""
    if name == "135m":
        return SHAPE
    from nostall.lm.models import BUILTIN_SIZES, char_tokenizer

    size = BUILTIN_SIZES[name]
    return dict(
        size,
        num_key_value_heads=size["num_attention_heads"],
        vocab_size=len(char_tokenizer()),
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )


def build_model(folder: str, shape: str, whole_vocab: bool = False) -> None:
    """`whole_vocab`: a tokenizer of the model's whole vocabulary (the characters, then tokens
    no text holds), so every side samples from the same 49,152 tokens and <eos> is as rare as
    any one of them: completions run to their full length on every side."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from nostall.lm.models import CHARACTERS, SPECIAL_TOKENS, char_tokenizer

    characters = None
    if whole_vocab:
        unused = shape_of(shape)["vocab_size"] - len(SPECIAL_TOKENS) - len(CHARACTERS)
        characters = [*CHARACTERS, *(f"<u{i}>" for i in range(unused))]
    tokenizer = char_tokenizer(characters)
    config_class, model_class = (
        (LlamaConfig, LlamaForCausalLM) if shape == "135m" else (Qwen2Config, Qwen2ForCausalLM)
    )
    config = config_class(
        **shape_of(shape),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_nostall(
    folder: str,
    steps: int,
    threads: int,
    side: str,
    new_tokens: int = NEW_TOKENS,
    generator: str = "native",
) -> dict:
    """`side`: nostall_default (every default), else staleness 0 with TRL's settings."""
    from nostall.algos import grpo

    extra = (
        {}
        if side.endswith("default")
        else {"staleness": 0, "learning_rate": 2e-3, "entropy_coef": 0.0}
    )
    if "fp32" in side:
        extra["dtype"] = "float32"
    if "bf16w" in side:
        extra["master_dtype"] = "bfloat16"
    args = grpo.GRPOCommandConfig(
        model=folder,
        steps=steps,
        num_prompts=PROMPTS,
        num_generations=GENERATIONS,
        max_new_tokens=new_tokens,
        generator=generator,
        torch_threads=threads,
        watch_syncs=False,
        log_interval=1,
        **extra,
    )
    trainer = grpo.GRPOTrainer(args=args)
    result = trainer.train()
    times = result.step_times
    return {
        "step_ms": [1e3 * (b - a) for a, b in itertools.pairwise(times)],
        "peak_mib": _peak_mib(),
        "dtype": str(trainer.setup.decoder.output_weight.dtype),
        "logp_difference_max": result.metrics.get("sampling/sampling_logp_difference/max"),
        "mean_length": result.metrics.get("completions/mean_length"),
        "generation_ms": result.generation_ms,
        "update_ms": result.update_ms,
        "weight_push_ms": result.weight_push_ms,
    }


def run_trl(
    folder: str, steps: int, threads: int, dtype: torch.dtype, new_tokens: int = NEW_TOKENS
) -> dict:
    import contextlib
    import io
    import random
    import warnings

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from nostall.lm.tasks import TASKS, answer_reward

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rng = random.Random(0)
    rows = [
        dict(zip(("prompt", "answer"), TASKS["copy"](rng), strict=True))
        for _ in range(PROMPTS * (steps + 1))
    ]
    stamps: list[float] = []
    lengths: list[float] = []

    class Recorder(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=PROMPTS * GENERATIONS,
            num_generations=GENERATIONS,
            max_completion_length=new_tokens,
            temperature=1.0,
            learning_rate=2e-3,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            epsilon=0.2,
            beta=0.0,
            loss_type="dapo",
            num_iterations=1,
            max_steps=steps,
            seed=0,
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=answer_reward,
                args=config,
                train_dataset=Dataset.from_list(rows),
                processing_class=tokenizer,
                callbacks=[Recorder()],
            )
            with contextlib.redirect_stdout(io.StringIO()):
                trainer.train()
    return {
        "step_ms": [1e3 * (b - a) for a, b in itertools.pairwise(stamps)],
        "peak_mib": _peak_mib(),
        "mean_length": lengths[-1] if lengths else None,
    }


def bandwidth_gbs(threads: int) -> float:
    """This machine's memory bandwidth as torch reads it: the best of a few sums over 512 MiB
    (far past the caches), in GB/s."""
    torch.set_num_threads(threads)
    data = torch.ones(128 << 20)  # 512 MiB of float32
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def floor_ms(threads: int, dtype: torch.dtype, shape: dict, new_tokens: int = NEW_TOKENS) -> dict:
    """The floor of one step at this shape and completion length, from this machine's own
    rates. Generation: the matrix products (each group's prompt once, then new_tokens - 1 decode
    steps for the batch, each sampled from the output layer's logits over the whole vocabulary,
    as both sides compute them: at 16 rows they stream the weights, so their time is the weight
    traffic) and each decode step's reads of the float32 key-value cache at the measured
    bandwidth. Update: the products of the forward and the backward's two (each group's prompt
    once; its output layer over the rows the loss reads is left out), and the attention's
    arithmetic (forward and a backward of twice its products) at the rate the update's own
    products reach."""
    torch.set_num_threads(threads)
    H, inter, L = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    D = H // heads
    kv = kv_heads * D
    weights = [torch.randn(n, H, dtype=dtype) for n in (H + 2 * kv, H, 2 * inter)]
    down = torch.randn(H, inter, dtype=dtype)
    head = torch.randn(shape["vocab_size"], H, dtype=dtype)

    def layer_ms(rows: int, logits: int = 0, repeat: int = 3) -> float:
        """L layers over `rows` rows, then the output layer over `logits` of them."""
        x, y = torch.randn(rows, H, dtype=dtype), torch.randn(rows, inter, dtype=dtype)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(L):
                for w in weights:
                    x @ w.T
                y @ down.T
            if logits:
                x[:logits] @ head.T
            best = min(best, time.perf_counter() - start)
        return 1e3 * best

    B, P, C = PROMPTS * GENERATIONS, 7, new_tokens
    products = layer_ms(PROMPTS * P, PROMPTS) + (C - 1) * layer_ms(B, B)
    # Each decode step t reads every row's keys and values of its P + t slots, every layer.
    cache_bytes = sum(B * L * 2 * kv * 4 * (P + t) for t in range(1, C))
    cache_ms = 1e3 * cache_bytes / (bandwidth_gbs(threads) * 1e9)
    rows = PROMPTS * P + B * C
    update_products = 3 * layer_ms(rows)
    product_flops = 3 * 2 * rows * L * H * (H + 2 * kv + H + 3 * inter)
    rate = product_flops / (update_products / 1e3)  # FLOP/s the update's products reach
    # Attention: each query against its keys, q.k and p.v, 2 D multiply-adds a head a key.
    pairs = PROMPTS * P * (P + 1) // 2 + B * sum(P + c + 1 for c in range(C))
    attention_flops = 3 * L * heads * 4 * D * pairs
    update = update_products + 1e3 * attention_flops / rate
    return {
        "generation_ms": products + cache_ms,
        "update_ms": update,
        "step_ms": products + cache_ms + update,
        "cache_ms": cache_ms,
        "attention_ms": 1e3 * attention_flops / rate,
        "products_tflops": rate / 1e12,
    }


def child(side: str, folder: str, steps: int, threads: int, shape: str, tokens: int) -> dict:
    if side.startswith("floor_"):
        dtype = torch.float32 if side == "floor_fp32" else torch.bfloat16
        return floor_ms(threads, dtype, shape_of(shape), tokens)
    if side.startswith("nostall"):
        return run_nostall(folder, steps, threads, side, tokens)
    dtype = torch.bfloat16 if side == "trl_bf16" else torch.float32
    return run_trl(folder, steps, threads, dtype, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument(
        "--shape",
        default="135m",
        choices=("135m", "small", "tiny"),
        help="the 135M shape (default), or a built-in size in between",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=NEW_TOKENS,
        help="each completion's tokens (past 8, a tokenizer of the whole vocabulary, so every "
        "completion runs to its full length on every side)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tokens = args.max_new_tokens
        print(
            json.dumps(child(args.child, args.folder, args.steps, args.threads, args.shape, tokens))
        )
        return
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        build_model(folder, args.shape, whole_vocab=args.max_new_tokens > NEW_TOKENS)
        for side in [*args.sides.split(","), "floor_fp32", "floor_bf16"]:
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.lm.scale_grpo",
                    "--child",
                    side,
                    "--folder",
                    folder,
                    "--steps",
                    str(args.steps),
                    "--threads",
                    str(args.threads),
                    "--shape",
                    args.shape,
                    "--max-new-tokens",
                    str(args.max_new_tokens),
                ],
                capture_output=True,
                text=True,
            )
            if run.returncode != 0:
                print(f"{side}: failed\n{run.stderr[-2000:]}")
                continue
            results[side] = json.loads(run.stdout.strip().splitlines()[-1])
    model = "135M-shaped Llama" if args.shape == "135m" else f"{args.shape} (built-in Qwen2)"
    print(
        f"{model}, {PROMPTS} prompts x {GENERATIONS} completions x {args.max_new_tokens} "
        f"tokens, {args.threads} threads; ms a step (median after the first), peak RSS"
    )
    floor = results.get("floor_bf16", {}).get("step_ms")
    medians = {
        s: statistics.median(r["step_ms"])
        for s, r in results.items()
        if "step_ms" in r and isinstance(r["step_ms"], list)
    }
    for side, ms in medians.items():
        result = results[side]
        extra = ""
        if "dtype" in result:  # the compute dtype auto chose, and generation's log-prob error
            extra = (
                f"   {result['dtype'].removeprefix('torch.')}, behaviour log-probs within "
                f"{result['logp_difference_max']:.2g} of the trainer's"
            )
        if result.get("generation_ms") is not None:
            extra += (
                f"   (generation {result['generation_ms']:.0f}, update {result['update_ms']:.0f})"
            )
        if result.get("mean_length") is not None:
            extra += f"   mean length {result['mean_length']:.1f}"
        over = f"   {ms / floor:.2f}x the bf16 floor" if floor else ""
        print(f"  {side:16s} {ms:8.0f} ms   peak {result['peak_mib']:6.0f} MiB{over}{extra}")
    for precision in ("fp32", "bf16"):
        low = results.get(f"floor_{precision}")
        if low:
            print(
                f"  floor {precision}: {low['step_ms']:.0f} ms a step (generation "
                f"{low['generation_ms']:.0f} of which cache reads {low['cache_ms']:.0f}; update "
                f"{low['update_ms']:.0f} of which attention {low['attention_ms']:.0f}; the "
                f"products at {low['products_tflops']:.2f} TFLOP/s)"
            )
    for mine in ("nostall_s0", "nostall_default", "nostall_fp32_s0", "nostall_bf16w_s0"):
        for theirs in ("trl_bf16", "trl_fp32"):
            if mine in medians and theirs in medians:
                print(f"  {theirs} / {mine}: {medians[theirs] / medians[mine]:.2f}x per step")


if __name__ == "__main__":
    main()
