"""Sequences each at its own length in one KV cache, advanced a step at a time by whichever
rows the caller names: the generation engine's part of continuous batching.

A row is one sequence (an episode of a multi-turn run). Its prompt is prefilled once; after that
a step feeds one token to each row named (a token it sampled, or one of a tool's answer: token
in, token out) and leaves every other row's cache and next-token logits as they were, so a row
waiting on its environment keeps its keys and values and rejoins later without re-reading its
context. Rows not named still go through the step's arithmetic (the decoder works on the whole
cache), writing into a spare slot no row attends to.

Layout: prompts are left-padded to P, so row r's prompt fills slots [P - L_r, P) at positions
[0, L_r); the t-th token after it goes to slot P + t at position L_r + t. The cache holds
P + `budget` slots and the spare one.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


class RowDecoder:
    """A batch of sequences in one cache, each fed and sampled on its own schedule."""

    @torch.no_grad()
    def __init__(self, engine, prompts: list[list[int]], budget: int, group_size: int = 1):
        """Prefills every prompt (one pass a group of `group_size` equal prompts) and keeps
        each row's next-token logits. `budget`: the tokens a row may take after its prompt."""
        if not prompts or any(not p for p in prompts):
            raise ValueError("every row needs a prompt of at least one token")
        if budget < 1:
            raise ValueError(f"budget must be at least 1, got {budget}")
        self.engine = engine
        decoder = engine.decoder
        device = engine.allowed.device
        B, P = len(prompts), max(len(p) for p in prompts)
        self.prompt_width, self.budget = P, budget
        self.spare = P + budget  # the slot rows not named in a step write to
        self.cache = decoder.new_cache(B, P + budget + 1)
        self.slot_mask = torch.zeros(B, P + budget + 1, dtype=torch.bool, device=device)
        ids = torch.full((B, P), engine.pad_token_id, dtype=torch.int64)
        mask = torch.zeros(B, P, dtype=torch.bool)
        for r, prompt in enumerate(prompts):
            ids[r, P - len(prompt) :] = torch.tensor(prompt, dtype=torch.int64)
            mask[r, P - len(prompt) :] = True
        ids, mask = ids.to(device), mask.to(device)
        self.slot_mask[:, :P] = mask
        self.prompt_lengths = [len(p) for p in prompts]
        self.fed = [0] * B  # tokens each row has been fed after its prompt
        decoder.freeze()  # the fused weights, from the model's current ones
        self.logits = decoder.prefill(ids[::group_size], mask[::group_size], self.cache, group_size)

    @property
    def rows(self) -> int:
        return len(self.fed)

    def room(self, row: int) -> int:
        """The tokens `row` may still be fed."""
        return self.budget - self.fed[row]

    @torch.no_grad()
    def sample(self, rows: list[int], uniform: Tensor) -> tuple[list[int], list[float]]:
        """A token for each of `rows` from its current logits, drawn with `uniform` ([len(rows),
        V], the rows' noise in that order); their log-probs under the untruncated policy."""
        device = self.logits.device
        index = torch.tensor(rows, dtype=torch.int64, device=device)
        finished = torch.zeros(len(rows), dtype=torch.bool, device=device)
        logits = self.logits.index_select(0, index).float()
        token, log_prob = self.engine.sample(logits, finished, uniform.to(device))
        # (which rows ended their turns decides the next step's rows: scheduled on the host)
        return token.tolist(), log_prob.tolist()  # sync: the turns' tokens to the scheduler

    @torch.no_grad()
    def step(self, rows: list[int], tokens: list[int]) -> None:
        """Feeds tokens[i] to rows[i] (each at its next slot); those rows' logits become the
        next token's. Other rows keep theirs."""
        if len(rows) != len(tokens):
            raise ValueError(f"{len(rows)} rows and {len(tokens)} tokens")
        B, P = self.rows, self.prompt_width
        # A row not named takes padding at position 0 into the spare slot (never read).
        token = torch.full((B,), self.engine.pad_token_id, dtype=torch.int64)
        position = torch.zeros(B, dtype=torch.int64)
        slot = torch.full((B,), self.spare, dtype=torch.int64)
        for r, t in zip(rows, tokens, strict=True):
            if self.fed[r] >= self.budget:
                raise ValueError(f"row {r} is full: its {self.budget} tokens fed already")
            token[r], position[r] = t, self.prompt_lengths[r] + self.fed[r]
            slot[r] = P + self.fed[r]
        device = self.slot_mask.device
        token, position, slot = token.to(device), position.to(device), slot.to(device)
        named = torch.tensor(rows, dtype=torch.int64, device=device)
        self.slot_mask[named, slot[named]] = True  # (each row attends to its own new slot)
        logits = self.engine.decoder.decode(token, position, slot, self.slot_mask, self.cache)
        self.logits[named] = logits.index_select(0, named).to(self.logits.dtype)
        for r in rows:
            self.fed[r] += 1
