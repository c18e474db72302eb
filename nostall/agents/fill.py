"""A GRPO batch of episodes: num_generations episodes of each prompt's environment seed (a
group), run by EpisodeRunner and written into the batch's slots: every token after the prompt
(the model's and the environment's) as the completion the trainer attends to, the model's alone
in the loss mask (TRL's tool_mask), the episode's return as its reward.

A failed episode (its environment raised, timed out or returned garbage) is left out of the
loss and takes its group's mean return among the episodes that did not fail (0 where none did),
so it moves no advantage; it is counted in the batch's figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nostall.agents.episodes import Episode, EpisodeRunner
from nostall.lm.batch import LMBatch


@dataclass
class EpisodeTask:
    """What the generation side runs episodes with: a new environment per episode, and the
    runner (the engine, the budgets)."""

    make_env: Callable[[], object]
    runner: EpisodeRunner
    # Scored by the run's reward functions over each episode's conversation (the tool
    # environment's `messages`), not by the environment's return.
    scored: bool = False
    # Where each rollout's environment is made from its row first (TRL's environment_factory):
    # (rows, group size) -> (the prompts, with the observations reset gave, and an instance
    # a rollout), each instance given to make_env. None: make_env() a rollout.
    start: Callable[[list[dict], int], tuple[list, list]] | None = None

    def fill(
        self,
        batch: LMBatch,
        rows: list[dict],
        group_size: int,
        noise_seed: int,
        score: Callable[[list[Episode]], list[float]] | None = None,
        instances: list | None = None,
        swap: Callable[[], int] | None = None,
    ) -> dict:
        """Runs the batch's episodes into `batch` (its prompts encoded already), scored by
        their returns or by `score`; returns the host figures: rewards, lengths, and the
        episodes' own figures. `swap`: in-flight weights (EpisodeRunner.run)."""
        prompt_ids = batch.prompt_ids.tolist()  # sync: episodes build their contexts on the host
        prompt_mask = batch.prompt_mask.tolist()  # sync: (likewise)
        episodes = []
        for i, row in enumerate(rows):
            for j in range(group_size):
                r = i * group_size + j
                prompt = [t for t, m in zip(prompt_ids[r], prompt_mask[r], strict=True) if m]
                seed = None if self.scored else _seed(row)  # (tools: no seeded state)
                env = self.make_env() if instances is None else self.make_env(instances[r])
                episodes.append(Episode(env, prompt, seed))
        timings = self.runner.run(episodes, noise_seed, swap)
        if score is not None:
            for episode, reward in zip(episodes, score(episodes), strict=True):
                episode.reward = reward
        _write(batch, episodes)
        rewards = _group_rewards(episodes, group_size)
        batch.rewards.copy_(torch.tensor(rewards, dtype=torch.float32))
        generated = timings.decode_s + timings.wait_s
        failed = sum(e.failure is not None for e in episodes)
        calls = sum(e.calls for e in episodes)
        figures = {
            # TRL's names: calls (environment steps, or tool calls) per episode, and the share
            # of them that failed
            "tools/call_frequency": calls / len(episodes),
            "tools/failure_frequency": sum(e.call_failures for e in episodes) / calls
            if calls
            else 0.0,
            "episodes/turns_mean": sum(e.turns for e in episodes) / len(episodes),
            "episodes/failed": float(failed),
            "episodes/truncated": float(sum(e.truncated for e in episodes)),
            "episodes/env_calls": float(timings.env_calls),
            "episodes/env_seconds": sum(e.env_seconds for e in episodes),
            # the decoder's idle share of the batch's generation: time with no episode ready
            "episodes/decoder_idle_fraction": timings.wait_s / generated if generated else 0.0,
        }
        return {
            "rewards": rewards,
            "episodes": episodes,
            "figures": figures,
            "spans": timings.spans,
            "token_versions": timings.token_versions,
            "swaps": timings.swaps,
        }


def _seed(row: dict) -> int:
    try:
        return int(row["answer"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"an environment task's row carries its environment's seed in `answer`; got {row!r}"
        ) from None


def _write(batch: LMBatch, episodes: list[Episode]) -> None:
    B, C = batch.completion_ids.shape
    ids = torch.full((B, C), 0, dtype=torch.int64)
    sampled = torch.zeros(B, C, dtype=torch.bool)
    present = torch.zeros(B, C, dtype=torch.bool)
    log_probs = torch.zeros(B, C, dtype=torch.float32)
    for r, e in enumerate(episodes):
        n = len(e.tokens)
        ids[r, :n] = torch.tensor(e.tokens, dtype=torch.int64)
        present[r, :n] = True
        if e.failure is None:  # (a failed episode's tokens: out of the loss)
            sampled[r, :n] = torch.tensor(e.sampled, dtype=torch.bool)
        log_probs[r, :n] = torch.tensor(e.log_probs, dtype=torch.float32)
    batch.completion_ids.copy_(ids)
    batch.completion_mask.copy_(present)
    batch.loss_mask.copy_(sampled)
    batch.log_probs.copy_(log_probs)


def _group_rewards(episodes: list[Episode], group_size: int) -> list[float]:
    rewards = []
    for g in range(0, len(episodes), group_size):
        group = episodes[g : g + group_size]
        kept = [e.reward for e in group if e.failure is None]
        stand_in = sum(kept) / len(kept) if kept else 0.0
        rewards += [e.reward if e.failure is None else stand_in for e in group]
    return rewards
