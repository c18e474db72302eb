"""The generation side of language-model RL: draws prompts, generates a group of completions
per prompt with the rollout side's model copy, scores them with the reward functions, and
writes everything into a preallocated batch for the trainer (LMBatch, batch.py; its prompts
encoded by prompts.py).

This is the `fill` of nostall.runtime.thread.RolloutLoop: it runs on the rollout side (a thread
of its own), so generation and rewards stay off the trainer's critical path, and a reward
function that raises stops the run with its traceback within the loop's poll interval.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nostall.lm.batch import LMBatch
from nostall.lm.generation import GenerationEngine
from nostall.lm.prompt_source import PromptSource
from nostall.lm.prompts import PromptEncoder
from nostall.lm.rewards import Rewards
from nostall.lm.stats import batch_stats
from nostall.runtime.watchdog import Watchdog, run_watched

Tensor = torch.Tensor


# The batch whose generation runs under SyncWatch (after warm-up), to report syncs per decode step.
WATCHED_BATCH = 3


@dataclass(frozen=True)
class GeneratorOptions:
    """How a GroupGenerator runs, beside what it generates."""

    watch_syncs: bool = True  # count the host syncs of one decode step (after warm-up)
    keep_texts: bool = False  # log_completions: each batch keeps its texts (batch.samples)
    generation_timeout_s: float | None = None  # a batch's generation (None: no limit)
    reward_timeout_s: float | None = None  # each reward call (None: no limit)
    data_seed: int | None = None  # the prompts' order (TRL's data_seed; None: the seed's)


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
        data_seed = options.data_seed
        source.seed(seed if data_seed is None else data_seed)  # (the prompts' order)
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
        # An environment task's episodes (nostall.agents.fill.EpisodeTask); None: one
        # completion a prompt.
        self.episodes = None
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
        instances = None
        if self.episodes is not None and self.episodes.start is not None:
            prompts, instances = self.episodes.start(rows, self.num_generations)
        batch.prompt_tokens = self.encoder.encode_into(
            prompts, batch.prompt_ids, batch.prompt_mask, self.num_generations
        )
        self._filled += 1
        if self.episodes is not None:  # multi-turn episodes with their environments
            self._fill_episodes(batch, rows, instances)
            return
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
        batch.loss_mask.copy_(batch.completion_mask)  # (every sampled token: no episodes)
        pushed = getattr(self.engine, "last_push", None)  # (vLLM's; the native engine's none)
        batch.weight_push = list(pushed) if pushed is not None else []
        batch.episode_spans = []
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

    def _fill_episodes(self, batch: LMBatch, rows: list[dict], instances=None) -> None:
        """The batch as episodes: with in-flight weights, newer ones taken between decode
        steps (each sampled token's version recorded); else one version for all of it."""
        if self.watchdog is not None:
            self.watchdog.doing(
                "episodes of a batch", self.generation_timeout_s, "generation_timeout"
            )
        # sync: one draw seeds the batch's episode noise (on the host, where episodes run)
        seed = int(
            torch.randint(1 << 62, (1,), generator=self.generator, device=self.generator.device)
        )
        G = self.num_generations
        score = None
        if self.episodes.scored:  # (the reward functions, over each conversation)
            score = functools.partial(self._score_conversations, rows)
        self.engine.begin_episodes()  # (vLLM: its weights pushed once for the batch)
        out = self.episodes.fill(batch, rows, G, seed, score, instances, self.refresh)
        self.engine.end_batch()
        batch.token_versions = list(out["token_versions"])
        self.swaps += out["swaps"]
        if self.release is not None:
            self.release()
        if self.watchdog is not None:
            self.watchdog.idle()
        episodes, rewards = out["episodes"], out["rewards"]
        lengths = [sum(e.sampled) for e in episodes]
        ended = [e.failure is None and not e.truncated for e in episodes]
        batch.reward_mean = sum(rewards) / len(rewards)
        batch.tokens = sum(lengths)
        pushed = getattr(self.engine, "last_push", None)  # (vLLM's, at the batch's start)
        batch.weight_push = list(pushed) if pushed is not None else []
        batch.episode_spans = [list(span) for span in out["spans"]]
        per_function = {"episode_return": [e.reward for e in episodes]}
        if self.episodes.scored:
            per_function = self.rewards.per_function
        batch.stats = {**batch_stats(rewards, per_function, lengths, ended, G), **out["figures"]}
        batch.samples = []
        if self.keep_texts:
            detokenize = self.episodes.runner.detokenize
            batch.samples = [
                {"prompt": row["prompt"], "completion": detokenize(e.tokens), "reward": r}
                for row, e, r in zip(
                    [row for row in rows for _ in range(G)], episodes, rewards, strict=True
                )
            ]

    def _score_conversations(self, rows: list[dict], episodes) -> list[float]:
        """The reward functions over each episode's conversation after its prompt (TRL's
        completions with tools: the assistant turns and tool messages)."""
        G = self.num_generations
        repeated = [row["prompt"] for row in rows for _ in range(G)]
        columns = {k: [row.get(k) for row in rows for _ in range(G)] for k in self.columns}
        completions = [list(e.env.messages) for e in episodes]
        if episodes[0].env.instance is not None:  # (TRL's: every reward function gets them)
            columns = {**columns, "environments": [e.env.instance for e in episodes]}
        score = functools.partial(
            self.rewards, repeated, completions, columns, self.watchdog, self.reward_timeout_s
        )
        return run_watched(score, self.watchdog) if self.watch_rewards_here else score()

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
