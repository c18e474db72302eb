"""Preallocated time-major rollout storage: the slots the rollout side fills and the trainer
side reads. Each step writes straight into a slot's rows (env.torch.step(..., out=rows)), so
collecting a rollout allocates nothing."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Chunk:
    """One rollout of T steps from N environments. obs[t] is what the policy saw at step t;
    obs[T] is the observation to continue from. With same-step autoreset, obs[t + 1] after a
    finished episode is the next episode's first observation, and final_obs[t] holds the
    finished episode's last one (for bootstrapping a truncation)."""

    obs: torch.Tensor  # (T + 1, N, obs_dim) float32, or uint8 for pixels (flattened frames)
    actions: torch.Tensor  # (T, N) int64, or (T, N, action_dim) float32
    log_probs: torch.Tensor  # (T, N) behaviour policy log-probabilities
    values: torch.Tensor  # (T, N) behaviour critic values
    rewards: torch.Tensor  # (T, N) float64, as the environments return them
    terminated: torch.Tensor  # (T, N) bool
    truncated: torch.Tensor  # (T, N) bool
    final_obs: torch.Tensor  # (T, N, obs_dim) like obs, valid where terminated | truncated
    version: int = -1  # the policy version that collected it

    @classmethod
    def empty(
        cls,
        T: int,
        N: int,
        obs_dim: int,
        action_shape: tuple[int, ...],
        discrete: bool,
        device: torch.device | str = "cpu",
        pin_memory: bool = False,
        obs_dtype: torch.dtype = torch.float32,
    ) -> Chunk:
        """Zeros; `pin_memory` (CPU only) for chunks copied to a GPU without a host wait.
        Pixel observations stay uint8 (obs_dtype), a quarter of float32's bytes."""
        action_dtype = torch.int64 if discrete else torch.float32

        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(*shape, dtype=dtype, device=device, pin_memory=pin_memory)

        return cls(
            obs=zeros(T + 1, N, obs_dim, dtype=obs_dtype),
            actions=zeros(T, N, *action_shape, dtype=action_dtype),
            log_probs=zeros(T, N),
            values=zeros(T, N),
            rewards=zeros(T, N, dtype=torch.float64),
            terminated=zeros(T, N, dtype=torch.bool),
            truncated=zeros(T, N, dtype=torch.bool),
            final_obs=zeros(T, N, obs_dim, dtype=obs_dtype),
        )

    @property
    def num_steps(self) -> int:
        return self.actions.shape[0]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "version"}

    def host_state(self) -> dict:
        """What the chunk holds on the host besides its tensors (a transport sends it along):
        nothing but its version, which travels apart."""
        return {}

    def load_host_state(self, state: dict) -> None:
        pass


def rollout_slots(
    staleness: int,
    num_steps: int,
    *,
    num_envs: int,
    obs_dim: int,
    action_shape: tuple[int, ...],
    discrete: bool,
    pin_memory: bool = False,
    obs_dtype: torch.dtype = torch.float32,
) -> list[Chunk]:
    """The chunks a runtime cycles through: S + 1 collected ahead, one being trained on."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    shape = (num_steps, num_envs, obs_dim, action_shape, discrete)
    return [
        Chunk.empty(*shape, pin_memory=pin_memory, obs_dtype=obs_dtype)
        for _ in range(staleness + 2)
    ]


def chunk_state(chunk: Chunk) -> dict:
    """A copy of a filled chunk (for a checkpoint)."""
    return {**{k: v.clone() for k, v in chunk.tensors().items()}, "version": chunk.version}


def load_chunk_state(chunk: Chunk, state: dict) -> None:
    for name, tensor in chunk.tensors().items():
        tensor.copy_(state[name])
    chunk.version = int(state["version"])
