"""The native decoder's pieces by sequence length, against the same decoder through torch's own
ops (nostall.lm.decoder.Decoder with native=False: torch's matrix products, its attention as
tensor ops), at a SmolLM2-135M-shaped Llama (random init, bf16 weights), side by side in one
run: a decode step for 16 rows at a cache of S slots (every slot attended), a prefill of 4
prompts of S tokens, and the update's forward and backward (4 prompts x 4 completions of C
tokens). Where the time goes as sequences grow: attention, which the matrix products do not
see.

    python -m benchmarks.lm.decoder_lengths [--threads 2] [--lengths 256,1024]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.lm.floor_grpo import median_ms
from benchmarks.lm.scale_grpo import SHAPE


def _decoders(threads: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    from nostall.lm.decoder import Decoder

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE)).to(torch.bfloat16)
    return {"native": Decoder(model), "torch": Decoder(model, native=False)}


def decode_ms(decoder, slots: int, rows: int = 16) -> float:
    decoder.freeze()
    cache = decoder.new_cache(rows, slots)
    cache.keys.normal_()
    cache.values.normal_()
    mask = torch.ones(rows, slots, dtype=torch.bool)
    token = torch.zeros(rows, dtype=torch.int64)
    position = torch.full((rows,), slots - 1)
    slot = torch.tensor([slots - 1])
    with torch.no_grad():
        return median_ms(lambda: decoder.decode(token, position, slot, mask, cache), 5, warmup=1)


def prefill_ms(decoder, length: int, prompts: int = 4) -> float:
    decoder.freeze()
    cache = decoder.new_cache(prompts, length + 1)
    ids = torch.randint(0, SHAPE["vocab_size"], (prompts, length))
    mask = torch.ones(prompts, length, dtype=torch.bool)
    with torch.no_grad():
        return median_ms(lambda: decoder.prefill(ids, mask, cache), 2, warmup=1)


def update_ms(decoder, length: int, prompts: int = 4, group: int = 4) -> float:
    decoder.thaw()
    prompt_ids = torch.randint(0, SHAPE["vocab_size"], (prompts, 7))
    prompt_mask = torch.ones(prompts, 7, dtype=torch.bool)
    ids = torch.randint(0, SHAPE["vocab_size"], (prompts * group, length))
    mask = torch.ones(prompts * group, length, dtype=torch.bool)

    def step():
        hidden = decoder.grouped_hidden(prompt_ids, prompt_mask, ids, mask)
        hidden.float().square().mean().backward()

    return median_ms(step, 2, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", default="256,1024")
    args = parser.parse_args()
    decoders = _decoders(args.threads)
    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"135M-shaped Llama, bf16 weights, {args.threads} threads; ms (median)")
    for length in lengths:
        pieces = {
            f"decode step, 16 rows x {length} slots": decode_ms,
            f"prefill, 4 prompts x {length} tokens": prefill_ms,
            f"update forward+backward, 4x4 x {length} tokens": update_ms,
        }
        for name, piece in pieces.items():
            native = piece(decoders["native"], length)
            through_torch = piece(decoders["torch"], length)
            print(
                f"  {name:48s} native {native:9.1f}   torch ops {through_torch:9.1f}   "
                f"{through_torch / native:5.2f}x"
            )


if __name__ == "__main__":
    main()
