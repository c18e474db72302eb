"""The generation side of language-model RL: draws prompts, generates a group of completions
per prompt with the rollout side's model copy, scores them with the reward functions, and
writes everything into a preallocated batch for the trainer.

This is the `fill` of nostall.runtime.thread.RolloutLoop: it runs on the rollout side (a thread
of its own), so generation and rewards stay off the trainer's critical path, and a reward
function that raises stops the run with its traceback within the loop's poll interval.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from nostall.lm.generation import Completions, GenerationEngine
from nostall.lm.stats import batch_stats
from nostall.lm.tasks import PromptSource, Rewards
from nostall.runtime.watchdog import Watchdog, run_watched

Tensor = torch.Tensor


@dataclass
class LMBatch:
    """One generation batch: num_prompts groups of num_generations completions each."""

    prompt_ids: Tensor  # (B, P) int64, left-padded, each prompt repeated num_generations times
    prompt_mask: Tensor  # (B, P) bool
    completion_ids: Tensor  # (B, C) int64
    completion_mask: Tensor  # (B, C) bool
    log_probs: Tensor  # (B, C) behaviour log-probs (the generator's)
    rewards: Tensor  # (B,) float32
    version: int = -1  # the policy version that generated it
    reward_mean: float = 0.0  # the batch's mean reward, computed on the host with the rewards
    tokens: int = 0  # completion tokens generated (host count, from the decoded lengths)
    # With in-flight weight swaps, the policy version that sampled each completion position
    # (every row swaps at the same token); empty when the whole batch is `version`'s.
    token_versions: list[int] = field(default_factory=list)
    # TRL's per-batch figures (reward_std, rewards/<function>/mean, completions/mean_length,
    # ...), computed on the host with the rewards (batch_stats).
    stats: dict[str, float] = field(default_factory=dict)
    # With log_completions: each row's prompt, completion and reward (texts, on the host).
    samples: list[dict] = field(default_factory=list)
    # [start, end] by the wall clock of the weight push into the engine that generated it
    # (vLLM takes a new version before a batch); empty when it pushed none.
    weight_push: list[float] = field(default_factory=list)

    @classmethod
    def empty(
        cls, batch: int, prompt_len: int, max_new_tokens: int, device: torch.device | str = "cpu"
    ) -> LMBatch:
        c = Completions.empty(batch, prompt_len, max_new_tokens, device)
        return cls(**c.tensors(), rewards=torch.zeros(batch, device=device))

    def completions(self) -> Completions:
        return Completions(
            self.prompt_ids,
            self.prompt_mask,
            self.completion_ids,
            self.completion_mask,
            self.log_probs,
        )

    def tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "Tensor"}

    def state_dict(self) -> dict:
        """A copy (for a checkpoint of a batch not yet trained on)."""
        state = {k: v.clone() for k, v in self.tensors().items()}
        state.update(version=self.version, **self.host_state())
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, tensor in self.tensors().items():
            tensor.copy_(state[name])
        self.version = int(state["version"])
        self.load_host_state({"token_versions": [], **state})  # (older checkpoints lack them)

    def host_state(self) -> dict:
        """What the batch holds on the host (a process transport sends it with the slot)."""
        return {
            "reward_mean": self.reward_mean,
            "tokens": self.tokens,
            "token_versions": list(self.token_versions),
            "stats": dict(self.stats),
            "samples": list(self.samples),
            "weight_push": list(self.weight_push),
        }

    def load_host_state(self, state: dict) -> None:
        self.reward_mean = float(state["reward_mean"])
        self.tokens = int(state["tokens"])
        self.token_versions = [int(v) for v in state["token_versions"]]
        self.stats = {str(k): float(v) for k, v in state.get("stats", {}).items()}
        self.samples = [{str(k): v for k, v in row.items()} for row in state.get("samples", [])]
        self.weight_push = [float(t) for t in state.get("weight_push", [])]

    def mean_token_lag(self, version: int) -> float:
        """How many versions behind `version` the batch's tokens were sampled, on average over
        the completion positions."""
        if not self.token_versions:
            return float(version - self.version)
        return version - sum(self.token_versions) / len(self.token_versions)


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


def render(tokenizer, prompt) -> str:
    """A prompt's text: itself, or a conversation through the tokenizer's chat template with the
    generation prompt (the assistant's turn continued where the conversation ends with it), as
    TRL renders it."""
    if isinstance(prompt, str):
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "conversational prompts need a tokenizer with a chat template; this "
            "one has none (give text prompts, or set "
            "tokenizer.chat_template)"
        )
    ends_with_assistant = prompt[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        list(prompt),
        tokenize=False,
        add_generation_prompt=not ends_with_assistant,
        continue_final_message=ends_with_assistant,
    )


class PromptEncoder:
    """Prompts (text, or conversations through the chat template) to left-padded ids of one
    fixed length (the longest prompt of the source), so every batch has the same shape."""

    def __init__(self, tokenizer, prompts: list, max_positions: int, max_new_tokens: int):
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = tokenizer.eos_token_id
        # A rendered conversation holds its special tokens already (TRL adds none either).
        self.chat = bool(prompts) and not isinstance(prompts[0], str)
        prompts = [render(tokenizer, p) for p in prompts]
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

    def encode_into(self, prompts: list, ids: Tensor, mask: Tensor, repeat: int) -> None:
        """Left-padded ids and mask of each prompt, `repeat` rows each, built on the host and
        copied to the batch's device in one copy each."""
        prompts = [render(self.tokenizer, p) for p in prompts]
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


# The batch whose generation runs under SyncWatch (after warm-up), to report syncs per decode step.
WATCHED_BATCH = 3


@dataclass(frozen=True)
class GeneratorOptions:
    """How a GroupGenerator runs, beside what it generates."""

    watch_syncs: bool = True  # count the host syncs of one decode step (after warm-up)
    keep_texts: bool = False  # log_completions: each batch keeps its texts (batch.samples)
    generation_timeout_s: float | None = None  # a batch's generation (None: no limit)
    reward_timeout_s: float | None = None  # each reward call (None: no limit)


class GroupGenerator:
    """Fills LMBatch slots: prompts, completions, behaviour log-probs and rewards.

    What it generates and how is given here; what ties it to a transport (its watchdog, the
    weights' `release` and `refresh`, where its reward calls are watched) the transport sets,
    as it does on every fill (nostall/runtime/protocol.py)."""

    def __init__(
        self,
        engine: GenerationEngine,
        encoder: PromptEncoder,
        source: PromptSource,
        rewards: Rewards,
        *,
        num_prompts: int,
        num_generations: int,
        seed: int,
        options: GeneratorOptions = GeneratorOptions(),
    ):
        self.engine, self.encoder, self.source, self.rewards = engine, encoder, source, rewards
        self.num_prompts, self.num_generations = num_prompts, num_generations
        # On the model's device: the sampler draws its noise there.
        self.generator = torch.Generator(engine.allowed.device).manual_seed(seed)
        source.seed(seed)
        self.eos_token_id = engine.eos_token_id
        self.watch_syncs = options.watch_syncs
        self.keep_texts = options.keep_texts
        self.generation_timeout_s = options.generation_timeout_s
        self.reward_timeout_s = options.reward_timeout_s
        # Where each step is marked with its limit (a reward call, generation), so a hang is
        # named: set by the transport (nostall.runtime.watchdog); None: unwatched.
        self.watchdog: Watchdog | None = None
        # Where this runs on the trainer's own thread (an inline loop), no other thread checks
        # the watchdog: the reward calls then run in a helper thread this one watches.
        self.watch_rewards_here = False
        # In-flight weight swaps: called between decode steps, loads newer published weights if
        # any and returns the version held (RolloutLoop.refresh); None: one version a batch.
        self.refresh: Callable[[], int] | None = None
        # Called when generation is done with the weights, before the rewards: a generation
        # side that reads the trainer's own weights lets them go (RolloutLoop.release_weights).
        self.release: Callable[[], None] | None = None
        self.swaps = 0  # in-flight swaps made
        self.columns = source.columns  # what the reward functions get besides the texts
        self.syncs_per_decode_step: float | None = None
        self.sync_sites: list[str] = []
        self._filled = 0

    @property
    def model(self) -> torch.nn.Module:
        """The generation side's model copy (published weights are loaded into it)."""
        return self.engine.model

    def state_dict(self) -> dict:
        """The sampling generator's and the prompt stream's state (for checkpoints)."""
        return {"generator": self.generator.get_state(), "prompts": self.source.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.source.load_state_dict(state["prompts"])

    def attach(self, loop) -> None:
        """Built beside the trainer (the thread transport): its reward calls are watched from
        this thread where the loop fills inline, the trainer's weights it reads are let go once
        a batch is generated (`release`), and the engine is told the version it holds."""
        self.watch_rewards_here = loop.inline
        self.release = loop.release_weights
        self.engine.attach(loop)

    def stats(self) -> dict:
        return {
            "syncs_per_decode_step": self.syncs_per_decode_step,
            "sync_sites": list(self.sync_sites),
            "swaps": self.swaps,
            **self.engine.stats(),
        }

    @property
    def slot_device(self) -> torch.device:
        """Where the batches it fills should live: its model's device (a Ray worker's slot)."""
        return next(self.model.parameters()).device

    def close(self) -> None:
        """Lets the engine go (a vLLM engine shuts down)."""
        self.engine.close()

    @torch.no_grad()
    def __call__(self, batch: LMBatch) -> None:
        rows = self.source.batch(self.num_prompts)
        prompts = [row["prompt"] for row in rows]
        self.encoder.encode_into(prompts, batch.prompt_ids, batch.prompt_mask, self.num_generations)
        self._filled += 1
        between_tokens = None
        batch.token_versions = []
        if self.refresh is not None:
            held = self.refresh()
            batch.token_versions = [held] * self.engine.sampling.max_new_tokens
            between_tokens = functools.partial(self._swap, batch.token_versions)
        watchdog = self.watchdog
        on_step = None
        if watchdog is not None:
            limit = self.generation_timeout_s
            watchdog.doing("generation of a batch", limit, "generation_timeout")  # (the fused
            # op has no steps between)

            def on_step(t: int) -> None:  # the per-token path beats every decode step
                watchdog.doing(f"generation, decode step {t}", limit, "generation_timeout")

        if self.watch_syncs and self._filled == WATCHED_BATCH:
            self._generate_watched(batch, between_tokens, on_step)
        else:
            self.engine.generate(
                batch.completions(), self.generator, self.num_generations, between_tokens, on_step
            )
        pushed = getattr(self.engine, "last_push", None)  # (vLLM's; the native engine's none)
        batch.weight_push = list(pushed) if pushed is not None else []
        if self.release is not None:
            self.release()
        texts, lengths, ended = self.decode(batch)
        G = self.num_generations
        repeated = [p for p in prompts for _ in range(G)]
        columns = {k: [row.get(k) for row in rows for _ in range(G)] for k in self.columns}
        completions = texts
        if self.encoder.chat:  # TRL's conversational completions
            completions = [[{"role": "assistant", "content": text}] for text in texts]
        score = functools.partial(
            self.rewards, repeated, completions, columns, watchdog, self.reward_timeout_s
        )
        rewards = run_watched(score, watchdog) if self.watch_rewards_here else score()
        if watchdog is not None:
            watchdog.idle()
        batch.rewards.copy_(torch.tensor(rewards, dtype=torch.float32))
        batch.reward_mean = sum(rewards) / len(rewards)
        batch.tokens = sum(lengths)
        batch.stats = batch_stats(rewards, self.rewards.per_function, lengths, ended, G)
        batch.samples = []
        if self.keep_texts:
            batch.samples = [
                {"prompt": p, "completion": c, "reward": r}
                for p, c, r in zip(repeated, texts, rewards, strict=True)
            ]

    def _swap(self, token_versions: list[int], t: int) -> bool:
        """Between decode steps: takes newer weights if published; tokens t.. get their version."""
        held = self.refresh()
        if held == token_versions[t - 1]:
            return False
        token_versions[t:] = [held] * (len(token_versions) - t)
        self.swaps += 1
        return True

    def _generate_watched(self, batch: LMBatch, between_tokens=None, on_step=None) -> None:
        """One generation under SyncWatch, with the model, the KV cache and the batch marked as
        device tensors: the unintended syncs it finds, per decode step."""
        from nostall.profiler import SyncWatch

        engine = self.engine
        with SyncWatch(engine.decoder.model) as watch:
            watch.mark(*batch.tensors().values(), engine.allowed)
            if engine._cache is not None and hasattr(engine._cache, "keys"):  # (a static cache)
                watch.mark(engine._cache.keys, engine._cache.values)
            engine.generate(
                batch.completions(), self.generator, self.num_generations, between_tokens, on_step
            )
        report = watch.report()
        self.syncs_per_decode_step = report.unintended_count / engine.sampling.max_new_tokens
        self.sync_sites = [f"{s.location} {s.kind}" for s in report.unintended]

    def decode(self, batch: LMBatch) -> tuple[list[str], list[int], list[bool]]:
        """Each completion up to its first <eos>, without special tokens; its length in
        tokens (<eos> included); and whether it ended with <eos> (else max_new_tokens cut it)."""
        # Reward functions read text: a host read (on the CPU a plain one).
        lengths = batch.completion_mask.sum(1).tolist()  # sync: rewards need the lengths
        ids = batch.completion_ids.tolist()  # sync: and the token ids
        ended = [
            bool(n) and row[n - 1] == self.eos_token_id for row, n in zip(ids, lengths, strict=True)
        ]
        cut = [
            row[: n - 1] if end else row[:n]
            for row, n, end in zip(ids, lengths, ended, strict=True)
        ]
        backend = self.encoder.backend
        if backend is not None:
            texts = [backend.decode(row, skip_special_tokens=True) for row in cut]
        else:
            texts = self.encoder.tokenizer.batch_decode(cut, skip_special_tokens=True)
        return texts, lengths, ended
