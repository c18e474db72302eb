"""Prompts into token ids: a tokenizer's fast path where it gives what the tokenizer would,
chat templates rendered for conversational rows, and PromptEncoder, which fits every prompt of
a run into one left-padded width and writes a batch's prompts, each repeated for its group."""

from __future__ import annotations

from typing import NamedTuple

import torch

Tensor = torch.Tensor


def _backend(tokenizer, prompts: list[str], encoded: list[list[int]], add_special: bool = True):
    """The `tokenizers` object behind a fast tokenizer, where calling it directly gives what the
    `transformers` wrapper gives: no clean-up of spaces after decoding, no padding or truncation
    set on it, and the same ids for every prompt of the source (checked here). Its calls skip the
    wrapper's per-token Python, about 0.3 ms a batch that the generation side held the GIL for.
    One call per text: the batch calls hand tiny batches to a thread pool of their own."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    if getattr(backend, "padding", None) or getattr(backend, "truncation", None):
        return None
    same = all(
        backend.encode(p, add_special_tokens=add_special).ids == ids
        for p, ids in zip(prompts, encoded, strict=True)
    )
    return backend if same else None


def _unknown_id(tokenizer) -> int | None:
    """The id a tokenizer gives what it does not know (its model's unknown token), if any."""
    if tokenizer.unk_token_id is not None:
        return int(tokenizer.unk_token_id)
    unk = getattr(getattr(getattr(tokenizer, "_tokenizer", None), "model", None), "unk_token", None)
    return None if unk is None else tokenizer.convert_tokens_to_ids(unk)


def _check_known(tokenizer, prompts: list[str], encoded: list[list[int]]) -> None:
    """ValueError for a prompt with text the tokenizer maps to its unknown token (the built-in
    character tokenizer's is <pad>): the model would see padding where the prompt has text."""
    unk = _unknown_id(tokenizer)
    if unk is None:
        return
    token = tokenizer.convert_ids_to_tokens(unk)
    for prompt, ids in zip(prompts, encoded, strict=True):
        if unk in ids and token not in prompt:
            raise ValueError(
                f"prompt {prompt!r} has text the tokenizer does not know: it "
                f"would become {token!r} (the built-in models know a-h, 0-9 and "
                "=)"
            )


class ToolPrompt(NamedTuple):
    """A conversation with tool schemas of its own (rows whose tools differ: TRL's dict of
    environment factories), rendered with them in place of the encoder's."""

    messages: list
    tools: list[dict] | None


def render(tokenizer, prompt, tools: list[dict] | None = None) -> str:
    """A prompt's text: itself, or a conversation through the tokenizer's chat template with the
    generation prompt (the assistant's turn continued where the conversation ends with it), as
    TRL renders it."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, ToolPrompt):
        prompt, tools = prompt.messages, prompt.tools
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "conversational prompts need a tokenizer with a chat template; this "
            "one has none (give text prompts, or set "
            "tokenizer.chat_template)"
        )
    ends_with_assistant = prompt[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        list(prompt),
        tools=tools or None,  # (TRL's `or None`: some templates render an empty tool list)
        tokenize=False,
        add_generation_prompt=not ends_with_assistant,
        continue_final_message=ends_with_assistant,
    )


class PromptEncoder:
    """Prompts (text, or conversations through the chat template) to left-padded ids of one
    fixed length (the longest prompt of the source), so every batch has the same shape."""

    def __init__(
        self,
        tokenizer,
        prompts: list,
        max_positions: int,
        max_new_tokens: int,
        tools: list[dict] | None = None,
    ):
        self.tokenizer, self.tools = tokenizer, tools  # (tools: schemas the template renders)
        self.pad_token_id = tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = tokenizer.eos_token_id
        # A rendered conversation holds its special tokens already (TRL adds none either).
        self.chat = bool(prompts) and not isinstance(prompts[0], str)
        if tools and not self.chat:
            raise ValueError("tools need conversational prompts (lists of messages), as TRL's")
        prompts = [render(tokenizer, p, tools) for p in prompts]
        encoded = tokenizer(prompts, add_special_tokens=not self.chat).input_ids
        _check_known(tokenizer, prompts, encoded)
        self.backend = _backend(tokenizer, prompts, encoded, not self.chat)
        lengths = [len(ids) for ids in encoded]
        self.length = max(lengths)
        self.check_room(max_new_tokens, max_positions)

    def check_room(self, max_new_tokens: int, max_positions: int) -> None:
        """ValueError when the longest prompt and `max_new_tokens` exceed the model's context."""
        if self.length + max_new_tokens > max_positions:
            raise ValueError(
                f"prompts of up to {self.length} tokens plus max_new_tokens {max_new_tokens} "
                f"exceed the model's context of {max_positions} positions"
            )

    def encode_into(self, prompts: list, ids: Tensor, mask: Tensor, repeat: int) -> int:
        """Left-padded ids and mask of each prompt, `repeat` rows each, built on the host and
        copied to the batch's device in one copy each; returns the prompt tokens, padding not
        counted (host lengths)."""
        prompts = [render(self.tokenizer, p, self.tools) for p in prompts]
        if self.backend is not None:
            rows = [self.backend.encode(p, add_special_tokens=not self.chat).ids for p in prompts]
        else:
            rows = self.tokenizer(prompts, add_special_tokens=not self.chat).input_ids
        for prompt, row in zip(prompts, rows, strict=True):
            if len(row) > self.length:
                raise ValueError(
                    f"prompt {prompt!r} has {len(row)} tokens, more than the {self.length} "
                    "the run was sized for"
                )
        # Padded as lists, then one tensor each (a tensor per row cost more than the tokenizer).
        pads = [self.length - len(row) for row in rows]
        padded = [[self.pad_token_id] * n + row for n, row in zip(pads, rows, strict=True)]
        host_ids = torch.tensor(padded, dtype=torch.int64)
        host_mask = torch.tensor([[False] * n + [True] * (self.length - n) for n in pads])
        ids.copy_(host_ids.repeat_interleave(repeat, 0))
        mask.copy_(host_mask.repeat_interleave(repeat, 0))
        return repeat * sum(len(row) for row in rows)
