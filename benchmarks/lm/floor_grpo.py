"""Where a GRPO step's time goes on the race workload (copy, tiny model, 8 prompts x 8
generations of 5 tokens, one torch thread), against the floor its matrix products set.

Times, side by side in one run:
- the matrix products one step needs, each through torch.mm at its real shape (MKL, one
  thread): generation (each prompt prefilled once, then the decode steps over 64 rows), the
  update's forward (each group's prompt once, a completion's last token not run) and its
  backward (two products per forward product: the input's gradient and the weight's);
- nostall's generation of one batch (GroupGenerator: prompts, generation, rewards) and one
  update (grpo_update: forward, log-probs, loss, backward, Adam), alone, median of many;
- what is left over the products: attention, norms, activations, sampling, Python, autograd.

    python -m benchmarks.lm.floor_grpo [--repeats 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from benchmarks.lm.bench_grpo import SAME_AS_TRL
from nostall.algos import grpo
from nostall.algos.grpo.setup import build
from nostall.lm.batch import LMBatch


def median_ms(fn, repeats: int, warmup: int | None = None) -> float:
    """The median of `repeats` calls of fn, in ms, after `warmup` calls (default: a tenth of
    the repeats, at least 5)."""
    for _ in range(max(5, repeats // 10) if warmup is None else warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _products(rows: int, config, backward: bool) -> list[tuple[int, int, int]]:
    """(M, K, N) of every product of one pass over `rows` token rows of the decoder's layers."""
    H, inner = config.hidden_size, config.intermediate_size
    D = H // config.num_attention_heads
    Q = (config.num_attention_heads + 2 * config.num_key_value_heads) * D
    A = config.num_attention_heads * D
    forward = [(rows, H, Q), (rows, A, H), (rows, H, 2 * inner), (rows, inner, H)]
    shapes = []
    for M, K, N in forward * config.num_hidden_layers:
        if backward:  # dX = dY W (M x N x K) and dW = dY^T X (N x M x K)
            shapes += [(M, N, K), (N, M, K)]
        else:
            shapes.append((M, K, N))
    return shapes


def _products_ms(shapes: list[tuple[int, int, int]], repeats: int) -> float:
    total = 0.0
    for M, K, N in shapes:
        a, b, out = torch.randn(M, K), torch.randn(K, N), torch.empty(M, N)
        total += median_ms(lambda a=a, b=b, out=out: torch.mm(a, b, out=out), repeats)
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=200)
    a = p.parse_args()
    torch.set_num_threads(1)
    args = grpo.GRPOCommandConfig(**SAME_AS_TRL, seed=1, steps=10, watch_syncs=False)
    setup = build(args)
    config = setup.lm.model.config
    P = setup.loop.slots[0].prompt_ids.shape[1]
    B, C, G = args.batch_size, args.max_new_tokens, args.num_generations
    prompt_rows = (B // G) * P
    generation = [prompt_rows] + [B] * (C - 1)  # the prefill, then the decode steps
    trained = prompt_rows + B * (C - 1)
    gen_products = sum(_products_ms(_products(r, config, False), a.repeats) for r in generation)
    fwd_products = _products_ms(_products(trained, config, False), a.repeats)
    bwd_products = _products_ms(_products(trained, config, True), a.repeats)

    generator = setup.generator
    generator.watch_syncs = False
    batch = LMBatch.empty(B, P, C)
    generator(batch)
    gen_ms = median_ms(lambda: generator(batch), a.repeats)

    def update():
        grpo.grpo_update(
            grpo.UpdateContext(
                setup.decoder, setup.optimizer, args, setup.vocab, setup.group_index
            ),
            batch,
            False,
            measure=False,  # (a step that does not log: no entropy pass without a bonus)
        )

    update_ms = median_ms(update, a.repeats)
    # the command's default bonus
    bonus = dataclasses.replace(args, entropy_coef=grpo.GRPOCommandConfig.entropy_coef)

    def update_with_bonus():
        grpo.grpo_update(
            grpo.UpdateContext(
                setup.decoder, setup.optimizer, bonus, setup.vocab, setup.group_index
            ),
            batch,
            False,
            measure=False,  # (a step that does not log: no entropy pass without a bonus)
        )

    bonus_ms = median_ms(update_with_bonus, a.repeats)
    step_products = gen_products + fwd_products + bwd_products
    print(
        f"one GRPO step of the race (tiny, {B} completions of {C} tokens after {P}-token "
        f"prompts, one thread), median of {a.repeats}"
    )
    print(f"   {'':34} {'products':>9} {'nostall':>9} {'left over':>10}")
    print(
        f"   {'generation (one batch, rewards in)':34} {gen_products:8.2f}m "
        f"{gen_ms:8.2f}m {gen_ms - gen_products:9.2f}m"
    )
    update_products = fwd_products + bwd_products
    print(
        f"   {'update (forward, backward, Adam)':34} {update_products:8.2f}m "
        f"{update_ms:8.2f}m {update_ms - update_products:9.2f}m"
    )
    print(
        f"   {'  with the entropy bonus':34} {update_products:8.2f}m "
        f"{bonus_ms:8.2f}m {bonus_ms - update_products:9.2f}m"
    )
    print(f"   {'  of which forward products':34} {fwd_products:8.2f}m")
    print(f"   {'  of which backward products':34} {bwd_products:8.2f}m")
    print(
        f"   synchronous step (generation + update): {gen_ms + update_ms:.2f} ms, "
        f"its products {step_products:.2f} ms ({step_products / (gen_ms + update_ms):.0%})"
    )
    print(
        f"   overlapped step (staleness 1, bounded by the update alone): {update_ms:.2f} ms, "
        f"its products {update_products:.2f} ms"
    )
    print("   (m: milliseconds)")


if __name__ == "__main__":
    main()
