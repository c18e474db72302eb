"""Batched generation without host syncs: prefill, then one decode step per token over a
preallocated KV cache, each token drawn by the native `sample_tokens` op.

Per token there is no scalar read, no reduction read back and no data-dependent shape: the
finished mask lives on the device and is updated by the sampler, finished rows emit padding,
and the loop runs for `max_new_tokens` steps. An early stop, when every row has finished, is
checked only every `stop_check_every` tokens (a host read, marked `# sync:`), 0 turning it
off.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from nostall.lm.decoder import Decoder
from nostall.ops.sampling import sample_tokens

Tensor = torch.Tensor


@dataclass
class Completions:
    """A batch of prompts (left-padded) and their sampled completions."""

    prompt_ids: Tensor  # (B, P) int64, left-padded
    prompt_mask: Tensor  # (B, P) bool, False on padding
    completion_ids: Tensor  # (B, C) int64, padding after <eos>
    completion_mask: Tensor  # (B, C) bool: the sampled tokens, <eos> included
    log_probs: Tensor  # (B, C) behaviour log-probs under the sampling distribution (0: masked)

    @classmethod
    def empty(
        cls, batch: int, prompt_len: int, max_new_tokens: int, device: torch.device | str = "cpu"
    ) -> Completions:
        def zeros(*shape, dtype):
            return torch.zeros(*shape, dtype=dtype, device=device)

        return cls(
            prompt_ids=zeros(batch, prompt_len, dtype=torch.int64),
            prompt_mask=zeros(batch, prompt_len, dtype=torch.bool),
            completion_ids=zeros(batch, max_new_tokens, dtype=torch.int64),
            completion_mask=zeros(batch, max_new_tokens, dtype=torch.bool),
            log_probs=zeros(batch, max_new_tokens, dtype=torch.float32),
        )

    def tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class SampledVocab:
    """The tokens the sampler may draw when some are banned (special tokens other than <eos>):
    their ids, and each token's index among them. Log-probabilities under the sampling
    distribution are then a softmax over those rows of the output weight alone, with no
    correction for the banned tokens' mass."""

    ids: Tensor  # (V',) int64: the allowed token ids, ascending
    index: Tensor  # (V,) int64: token id -> its index in ids (0 for banned ones: never sampled)

    @classmethod
    def build(
        cls, vocab_size: int, banned_token_ids: list[int], device: torch.device | str = "cpu"
    ) -> SampledVocab | None:
        """None when nothing is banned (every token may be sampled)."""
        banned = set(banned_token_ids)
        if not banned:
            return None
        ids = [t for t in range(vocab_size) if t not in banned]
        if not ids:
            raise ValueError("every token of the vocabulary is banned from sampling")
        index = torch.zeros(vocab_size, dtype=torch.int64)
        index[ids] = torch.arange(len(ids))
        return cls(torch.tensor(ids, dtype=torch.int64, device=device), index.to(device))


def positions_of(mask: Tensor) -> Tensor:
    """Position ids of a left-padded batch: 0 at each row's first real token (padding: 0)."""
    return (mask.long().cumsum(1) - 1).clamp(min=0)


# How often a turn of an episode checks whether every row has ended (generate_turn), in tokens.
TURN_STOP_CHECK = 8

# The largest noise tensor drawn for a whole batch at once (64 MiB); past it, a step at a time.
NOISE_UPFRONT_BYTES = 64 << 20


@dataclass
class SamplingConfig:
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    """keep tokens whose probability is at least min_p times the likeliest's (0: all)"""
    repetition_penalty: float = 1.0
    """transformers' repetition penalty on tokens already in the row (1: none)"""
    stop_check_every: int = 0
    """check every this many tokens whether every row has finished (a host read); 0: never"""
    cuda_graph: bool = False
    """on a CUDA device, capture the decode step once per batch shape and replay it per token
    (one launch instead of a few hundred); ignored on the CPU"""

    @property
    def processes_logits(self) -> bool:
        """min_p or a repetition penalty: applied to the logits before sample_tokens."""
        return self.min_p > 0 or self.repetition_penalty != 1.0


class GenerationEngine:
    """Generates completions for batches of one shape with a decoder and a sampling config."""

    def __init__(
        self,
        decoder: Decoder,
        sampling: SamplingConfig,
        *,
        eos_token_id: int,
        pad_token_id: int,
        banned_token_ids: list[int],
    ):
        if sampling.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {sampling.max_new_tokens}")
        self.decoder = decoder
        self.sampling = sampling
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        weight = decoder.output_weight
        self.allowed = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
        self.allowed[banned_token_ids] = False
        self._cache = None
        self._shape: tuple[int, int, int] | None = None

    def attach(self, loop) -> None:
        """(It reads the weights it is given at each step: nothing ties it to a loop.)"""

    def begin_episodes(self) -> None:
        """(Before a batch of episodes: nothing to push, each batch freezes the model's current
        weights.)"""

    def end_batch(self) -> None:
        """(After a batch: nothing held to let go of beyond its tensors.)"""

    @property
    def continuous(self) -> bool:
        """Whether multi-turn episodes run here as one continuous batch, each one's cache kept
        across its turns (agents/continuous.py over lm/rows.py): with every sampling option
        but min_p and the repetition penalty, which only generate()'s rounds apply."""
        return not self.sampling.processes_logits

    @property
    def model(self) -> torch.nn.Module:
        """The model generating (published weights are loaded into it)."""
        return self.decoder.model

    def _buffers(self, batch: int, prompt_len: int):
        """The cache and per-step buffers, kept across calls of the same shape."""
        shape = (batch, prompt_len, self.sampling.max_new_tokens)
        if self._shape != shape:
            slots = prompt_len + self.sampling.max_new_tokens
            device = self.decoder.output_weight.device
            self._cache = self.decoder.new_cache(batch, slots)
            self._slots = torch.arange(slots, device=device)
            self._slot_mask = torch.zeros(batch, slots, dtype=torch.bool, device=device)
            self._finished = torch.zeros(batch, dtype=torch.bool, device=device)
            self._shape = shape
            self._graph = None
        return self._cache

    def _captured_decode(self, cache):
        """The decode step as a CUDA graph over static inputs (token, position, slot): captured
        on first use for this batch shape, then replayed. Inputs are copied in on the stream,
        so nothing waits on the host."""
        B = self._slot_mask.shape[0]
        device = self._slot_mask.device
        if self._graph is None:
            static = {
                "token": torch.zeros(B, dtype=torch.int64, device=device),
                "position": torch.zeros(B, dtype=torch.int64, device=device),
                "slot": torch.zeros(1, dtype=torch.int64, device=device),
            }
            self._graph = [None, static, None]

        def step():
            static = self._graph[1]
            return self.decoder.decode(
                static["token"], static["position"], static["slot"], self._slot_mask, cache
            )

        def replay(token, position, slot):
            state = self._graph
            static = state[1]
            static["token"].copy_(token)
            static["position"].copy_(position)
            static["slot"].copy_(slot)
            if state[0] is None:
                # Warm-up off the capture (as CUDA graphs need), on these very inputs: it writes
                # the cache slot this step writes anyway.
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(2):
                        step()
                torch.cuda.current_stream(device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    state[2] = step()
                state[0] = graph
            state[0].replay()
            return state[2]

        return replay

    @torch.no_grad()
    def generate(
        self,
        batch: Completions,
        generator: torch.Generator,
        group_size: int = 1,
        between_tokens: Callable[[int], bool] | None = None,
        on_step: Callable[[int], None] | None = None,
        noise=None,
    ) -> Completions:
        """Fills `batch`'s completion fields from its prompt fields (in place), and returns it.
        With `group_size` G, rows come in groups of G copies of one prompt: each prompt is
        prefilled once. `between_tokens(t)`, when given, runs before the decode step whose
        logits sample token t (t >= 1) and returns whether it changed the model's weights (an
        in-flight weight swap): the fused weights are then refreshed in place, and the keys and
        values already cached stay as the older weights computed them. `on_step(t)`, when
        given, is called before each token's step on the per-token path (a liveness beat).
        `noise`, when given, is the uniform noise tokens are drawn with, in place of
        `generator`'s (an episode's turns draw their own, whatever batch they join):
        `noise(t)` token t's [B, V], called for t = 0, 1, ... in order, or `noise.block(C)` all
        C tokens' [C, B, V] at once."""
        B, P = batch.prompt_ids.shape
        C = self.sampling.max_new_tokens
        if batch.completion_ids.shape != (B, C):
            raise ValueError(
                f"the batch holds {batch.completion_ids.shape[1]} completion "
                f"tokens per row, the engine generates {C}"
            )
        cache = self._buffers(B, P)
        self.decoder.freeze()  # the fused weights, from the model's current ones
        cfg = self.sampling
        prompts, prompt_mask = batch.prompt_ids[::group_size], batch.prompt_mask[::group_size]
        # Every token's noise drawn up front where it is small, so a batch that stops early
        # leaves the generator where a full one would and both paths below draw the same; a
        # large [C, B, V] (a real vocabulary, long completions) is drawn a step at a time.
        V = self.allowed.shape[0]
        device = self.allowed.device
        uniform = None
        if C * B * V * 4 <= NOISE_UPFRONT_BYTES:  # (an episode turn's noise too: its rows')
            if noise is None:
                uniform = torch.rand((C, B, V), generator=generator, device=device)
            else:
                uniform = noise.block(C)
        if (
            uniform is not None
            and between_tokens is None
            and not cfg.processes_logits
            and self.decoder._native_applies()
        ):
            # The whole batch in one native op, the GIL released throughout.
            ids, mask, log_prob = torch.ops.nostall.generate_completions.default(
                prompts,
                prompt_mask,
                group_size,
                uniform,
                self.allowed,
                *self.decoder._weight_lists(),
                cache.keys,
                cache.values,
                *self.decoder._native_config(),
                float(cfg.temperature),
                cfg.top_k,
                float(cfg.top_p),
                self.eos_token_id,
                self.pad_token_id,
            )
            batch.completion_ids.copy_(ids)
            batch.completion_mask.copy_(mask)
            batch.log_probs.copy_(log_prob)
            return batch
        logits = self.decoder.prefill(prompts, prompt_mask, cache, group_size)
        next_position = batch.prompt_mask.sum(1)  # (B,): each row's first completion position
        slot_mask, finished = self._slot_mask, self._finished
        decode = functools.partial(self.decoder.decode, slot_mask=slot_mask, cache=cache)
        if cfg.cuda_graph and slot_mask.device.type == "cuda" and self.decoder.graphable:
            decode = self._captured_decode(cache)
        slot_mask.zero_()
        slot_mask[:, :P] = batch.prompt_mask
        finished.zero_()
        batch.completion_ids.fill_(self.pad_token_id)
        batch.completion_mask.zero_()
        batch.log_probs.zero_()
        seen = None
        if cfg.repetition_penalty != 1.0:  # [B, V]: the tokens each row holds so far
            # (A column past the vocabulary takes the padding and finished rows' tokens.)
            seen = torch.zeros(B, V + 1, dtype=torch.bool, device=slot_mask.device)
            seen.scatter_(1, batch.prompt_ids.masked_fill(~batch.prompt_mask, V), True)
        for t in range(C):
            if on_step is not None:
                on_step(t)
            torch.logical_not(finished, out=batch.completion_mask[:, t])
            drawn_from = logits.float()
            if cfg.processes_logits:
                drawn_from = self._processed(drawn_from, seen)
            token, log_prob = self.sample(
                drawn_from,
                finished,
                uniform[t]
                if uniform is not None
                else noise(t)
                if noise is not None
                else torch.rand((B, V), generator=generator, device=device),
            )
            if cfg.processes_logits:  # the policy's log-prob, as the trainer computes it
                log_prob = self._policy_log_prob(logits.float(), token, batch.completion_mask[:, t])
            if seen is not None:
                held = token.masked_fill(~batch.completion_mask[:, t], V)
                seen.scatter_(1, held[:, None], True)
            batch.completion_ids[:, t] = token
            batch.log_probs[:, t] = log_prob
            if t == C - 1:
                break
            if cfg.stop_check_every and (t + 1) % cfg.stop_check_every == 0:
                if bool(finished.all()):  # sync: early stop, every stop_check_every tokens
                    break
            slot_mask[:, P + t] = True
            if between_tokens is not None and between_tokens(t + 1):
                self.decoder.freeze()  # the same buffers: a captured graph reads the new weights
            logits = decode(token, next_position + t, self._slots[P + t : P + t + 1])
        return batch

    def generate_turn(self, contexts: list[list[int]], max_new_tokens: int, noise) -> Completions:
        """One turn of each of a set of episodes: every context (token ids) continued by up to
        `max_new_tokens` tokens drawn with `noise` (left-padded as prompts; nothing shared)."""
        device = self.allowed.device
        width = max(len(c) for c in contexts)
        batch = Completions.empty(len(contexts), width, max_new_tokens, device)
        for row, context in enumerate(contexts):
            ids = torch.tensor(context, dtype=torch.int64)
            batch.prompt_ids[row, width - len(context) :] = ids
            batch.prompt_mask[row, width - len(context) :] = True
        held = self.sampling
        # A turn ends at <eos>, most far short of the budget: every TURN_STOP_CHECK tokens the
        # round checks whether every row has ended (a host read) and stops there.
        self.sampling = dataclasses.replace(
            held,
            max_new_tokens=max_new_tokens,
            stop_check_every=held.stop_check_every or TURN_STOP_CHECK,
        )
        try:
            return self.generate(batch, torch.Generator(device), noise=noise)
        finally:
            self.sampling = held

    def sample(self, logits: Tensor, finished: Tensor, uniform: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's token from `logits` [B, V] with the engine's sampling (temperature, top-k,
        top-p, the allowed tokens) and `uniform` noise [B, V]: (token, its log-prob under the
        untruncated policy); finished rows give padding and 0, a row drawing <eos> is marked
        finished (sample_tokens)."""
        cfg = self.sampling
        return sample_tokens(
            logits,
            finished,
            self.allowed,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            uniform=uniform,
        )

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        """(Nothing held beyond its tensors.)"""

    def _processed(self, logits: Tensor, seen: Tensor | None) -> Tensor:
        """The logits the token is drawn from: transformers' repetition penalty (positive
        logits of tokens a row holds divided by it, negative ones multiplied), then min_p (a
        token below min_p times the likeliest allowed one's probability, at the temperature,
        is never drawn)."""
        cfg = self.sampling
        if seen is not None:
            seen, penalty = seen[:, :-1], cfg.repetition_penalty
            logits = torch.where(
                seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits
            )
        if cfg.min_p > 0:
            scaled = (logits / cfg.temperature).masked_fill(~self.allowed, float("-inf"))
            floor = scaled.amax(-1, keepdim=True) + math.log(cfg.min_p)
            logits = logits.masked_fill(scaled < floor, float("-inf"))
        return logits

    def _policy_log_prob(self, logits: Tensor, token: Tensor, sampled: Tensor) -> Tensor:
        """Each row's token log-prob under the policy (temperature, allowed tokens, no
        processing); 0 for rows already finished."""
        x = (logits / self.sampling.temperature).masked_fill(~self.allowed, float("-inf"))
        log_prob = x.log_softmax(-1).gather(1, token[:, None])[:, 0]
        return torch.where(sampled, log_prob, 0.0)
