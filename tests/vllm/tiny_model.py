"""A tiny causal LM vLLM's CPU attention takes (head size 64; the built-in `tiny` has 16), over
the built-in character tokenizer of the copy task, saved as a model directory."""

from pathlib import Path

import torch

from nostall.lm.models import char_tokenizer
from nostall.lm.tasks import TASK_CHARACTERS


def save_tiny_model(folder: Path, seed: int = 0) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = char_tokenizer(TASK_CHARACTERS.get("copy"))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).float()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
