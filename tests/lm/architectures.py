"""Small random-init models of the architectures users train, over the built-ins' character
tokenizer (22 tokens), saved as a user's model directory would be."""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(vocab_size=22, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _configs() -> dict:
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        GPT2Config,
        LlamaConfig,
        MistralConfig,
        Olmo2Config,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    llama_like = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **COMMON,
    )
    return {
        "llama": LlamaConfig(**llama_like),
        "qwen2": Qwen2Config(**llama_like, tie_word_embeddings=True),
        "qwen3": Qwen3Config(**llama_like, head_dim=8),
        "mistral_sliding": MistralConfig(**llama_like, sliding_window=4),
        "gemma3": Gemma3TextConfig(
            **llama_like, head_dim=8, sliding_window=4, final_logit_softcapping=None
        ),
        # Soft-capped logits (30) and attention scores (50), Gemma2's defaults.
        "gemma2": Gemma2Config(**llama_like, head_dim=8, sliding_window=4),
        "phi3": Phi3Config(**llama_like),
        "olmo2": Olmo2Config(**llama_like),
        "gpt2": GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **COMMON),
    }


ARCHITECTURES = [
    "llama",
    "qwen2",
    "qwen3",
    "mistral_sliding",
    "gemma2",
    "gemma3",
    "phi3",
    "olmo2",
    "gpt2",
]


def build(name: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of architecture `name`, random-init from `seed`."""
    from transformers import AutoModelForCausalLM

    from nostall.lm.models import char_tokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(_configs()[name]).to(dtype)
    return model.eval(), char_tokenizer()


def save(name: str, folder: Path, dtype: torch.dtype = torch.float32) -> Path:
    model, tokenizer = build(name, dtype=dtype)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
