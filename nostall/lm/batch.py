"""LMBatch: one preallocated batch of language-model RL, as the generation side fills it and
the trainer reads it (prompts, completions, behaviour log-probs, rewards, the policy version
that generated it), with what a checkpoint or another process needs to move it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from nostall.lm.generation import Completions

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
    # (B, C) bool: the tokens the loss covers: the sampled ones (completion_mask), less an
    # episode's environment and tool tokens (TRL's tool_mask) and a failed episode's
    loss_mask: Tensor
    version: int = -1  # the policy version that generated it
    reward_mean: float = 0.0  # the batch's mean reward, computed on the host with the rewards
    tokens: int = 0  # completion tokens generated (host count, from the decoded lengths)
    prompt_tokens: int = 0  # the prompts' tokens over the batch's rows (padding not counted)
    # With in-flight weight swaps, the policy version that sampled each completion position
    # (every row swaps at the same token; a batch of episodes: each sampled token's, in the
    # order sampled); empty when the whole batch is `version`'s.
    token_versions: list[int] = field(default_factory=list)
    # TRL's per-batch figures (reward_std, rewards/<function>/mean, completions/mean_length,
    # ...), computed on the host with the rewards (batch_stats).
    stats: dict[str, float] = field(default_factory=dict)
    # With log_completions: each row's prompt, completion and reward (texts, on the host).
    samples: list[dict] = field(default_factory=list)
    # [start, end] by the wall clock of the weight push into the engine that generated it
    # (vLLM takes a new version before a batch); empty when it pushed none.
    weight_push: list[float] = field(default_factory=list)
    # Multi-turn episodes: [side, start, end] by the wall clock of each decode round ("decode"),
    # environment call ("tool") and wait with no episode ready ("idle"), for the timeline.
    episode_spans: list[list] = field(default_factory=list)

    @classmethod
    def empty(
        cls, batch: int, prompt_len: int, max_new_tokens: int, device: torch.device | str = "cpu"
    ) -> LMBatch:
        c = Completions.empty(batch, prompt_len, max_new_tokens, device)
        return cls(
            **c.tensors(),
            rewards=torch.zeros(batch, device=device),
            loss_mask=torch.zeros_like(c.completion_mask),
        )

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
            # (a checkpoint from before episodes: its loss covered every sampled token)
            tensor.copy_(
                state[name] if name != "loss_mask" else state.get(name, state["completion_mask"])
            )
        self.version = int(state["version"])
        self.load_host_state({"token_versions": [], **state})  # (older checkpoints lack them)

    def host_state(self) -> dict:
        """What the batch holds on the host (a process transport sends it with the slot)."""
        return {
            "reward_mean": self.reward_mean,
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "token_versions": list(self.token_versions),
            "stats": dict(self.stats),
            "samples": list(self.samples),
            "weight_push": list(self.weight_push),
            "episode_spans": [list(span) for span in self.episode_spans],
        }

    def load_host_state(self, state: dict) -> None:
        self.reward_mean = float(state["reward_mean"])
        self.tokens = int(state["tokens"])
        self.prompt_tokens = int(state.get("prompt_tokens", 0))
        self.token_versions = [int(v) for v in state["token_versions"]]
        self.stats = {str(k): float(v) for k, v in state.get("stats", {}).items()}
        self.samples = [{str(k): v for k, v in row.items()} for row in state.get("samples", [])]
        self.weight_push = [float(t) for t in state.get("weight_push", [])]
        self.episode_spans = [
            [str(side), float(start), float(end)]
            for side, start, end in state.get("episode_spans", [])
        ]

    def mean_token_lag(self, version: int) -> float:
        """How many versions behind `version` the batch's tokens were sampled, on average over
        the completion positions (a batch of episodes: its sampled tokens)."""
        if not self.token_versions:
            return float(version - self.version)
        return version - sum(self.token_versions) / len(self.token_versions)
