"""Causal language models and tokenizers for the language-model trainers, from `transformers`.

`load_model("PATH")` loads any local causal LM directory (`AutoModelForCausalLM`,
`AutoTokenizer`; nothing is fetched from a hub). Two built-ins need no files at all, so every
test and benchmark runs offline on a CPU:
- `tiny`: `Qwen2Config(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
  tie_word_embeddings=True)`, randomly initialised;
- `small`: the same family at hidden 256, 4 layers (generation and update of similar cost);
both with a character tokenizer: one token per character, `<bos>` prepended, 22 tokens
(`<pad>`, `<bos>`, `<eos>`, `a`-`h`, `0`-`9`, `=`).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch

CHARACTERS = list("abcdefgh") + list(string.digits) + ["="]
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]
BUILTIN_SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4),
    "small": dict(
        hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4
    ),
}


@dataclass
class LanguageModel:
    """A causal LM and its tokenizer, with the token ids generation needs."""

    model: torch.nn.Module
    tokenizer: object  # a transformers PreTrainedTokenizerBase
    name: str

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return self.eos_token_id if pad is None else int(pad)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def banned_token_ids(self) -> list[int]:
        """Special tokens other than `<eos>`: never sampled into a completion (a policy that
        emits `<pad>` or `<bos>` could hack a reward that strips special tokens), and ids past
        the tokenizer's vocabulary (padding rows of the embedding)."""
        vocab = self.vocab_size
        # A special token past the embedding (a reloaded Qwen2 tokenizer adds an unknown token
        # the model has no row for) cannot be sampled anyway: only the model's rows are banned.
        special = {i for i in self.tokenizer.all_special_ids if i < vocab} - {self.eos_token_id}
        known = len(self.tokenizer)
        return sorted(special | set(range(known, vocab)))


def char_tokenizer(characters: list[str] | None = None):
    """The built-ins' tokenizer: WordLevel, one token per character (of `characters`, default
    CHARACTERS), `<bos>` prepended."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + (characters or CHARACTERS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )


def builtin_model(name: str, seed: int = 0, characters: list[str] | None = None) -> LanguageModel:
    """`tiny` or `small`: a randomly initialised Qwen2 over the character tokenizer (of
    `characters`: a task's alphabet, default CHARACTERS)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = char_tokenizer(characters)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        num_key_value_heads=BUILTIN_SIZES[name]["num_attention_heads"],
        # (No learned positions: this sizes the rotary tables only, not the weights.)
        max_position_embeddings=64 if characters is None else 128,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **BUILTIN_SIZES[name],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return LanguageModel(model.float(), tokenizer, name)


def cached_snapshot(repo_id: str) -> Path:
    """A Hub id's snapshot already in the local Hugging Face cache (HF_HOME / HF_HUB_CACHE), as
    transformers would find it offline; nothing is downloaded. ValueError saying how to get it
    otherwise."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        raise ValueError(
            f"model {repo_id!r} is neither a built-in ({', '.join(BUILTIN_SIZES)}), a local "
            f"model directory, nor a Hub id in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); nostall downloads nothing: fetch it first "
            f"(`hf download {repo_id}`) or give its directory"
        ) from None


def load_model(
    name_or_path: str,
    seed: int = 0,
    characters: list[str] | None = None,
    dtype: torch.dtype = torch.float32,
) -> LanguageModel:
    """A built-in (`tiny`, `small`; its tokenizer of `characters`, a task's alphabet), a local
    model directory or a Hub id already in the local Hugging Face cache, its parameters in
    `dtype` (a directory's converted as they load: no float32 copy on the way); ValueError with
    the reason when the path is missing or holds no causal LM or tokenizer, or the tokenizer
    has no `<eos>`."""
    if name_or_path in BUILTIN_SIZES:
        lm = builtin_model(name_or_path, seed, characters)
    else:
        path = Path(name_or_path)
        if not path.is_dir():
            path = cached_snapshot(name_or_path)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"cannot load a causal LM from {path}: {e}") from None
        lm = LanguageModel(model, tokenizer, str(path))
    if lm.tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer of {name_or_path!r} has no <eos> token")
    return lm


def load_tokenizer_beside(model: torch.nn.Module):
    """The tokenizer saved with a `transformers` model (its `name_or_path`, a local folder);
    ValueError asking for one when there is none."""
    path = Path(getattr(model, "name_or_path", "") or "")
    if str(path) and path.is_dir():
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ValueError(
                f"no tokenizer beside the model in {path} ({e}): pass processing_class="
            ) from None
    raise ValueError(
        "the model has no local folder to find its tokenizer in: pass "
        "processing_class= (a transformers tokenizer)"
    )
