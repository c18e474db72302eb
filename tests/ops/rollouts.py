"""Random time-major rollouts for the advantage-op tests, with Gymnasium's flag semantics:
terminated implies done; done without terminated is a truncation."""

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    reward: torch.Tensor
    value: torch.Tensor
    next_value: torch.Tensor
    done: torch.Tensor
    terminated: torch.Tensor
    behavior_log_prob: torch.Tensor
    target_log_prob: torch.Tensor

    def to(self, device: str) -> "Rollout":
        return Rollout(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def make_rollout(
    T: int,
    N: int,
    dtype: torch.dtype = torch.float64,
    p_terminated: float = 0.05,
    p_truncated: float = 0.05,
    seed: int = 0,
) -> Rollout:
    g = torch.Generator().manual_seed(seed)

    def randn() -> torch.Tensor:
        return torch.randn(T, N, generator=g, dtype=dtype)

    terminated = torch.rand(T, N, generator=g) < p_terminated
    truncated = torch.rand(T, N, generator=g) < p_truncated
    value = randn()
    # next_value[t] is value[t + 1] inside an episode, an independent value across a boundary
    # (the final observation of a truncated episode) and at the end of the rollout.
    next_value = randn()
    next_value[:-1] = torch.where((terminated | truncated)[:-1], next_value[:-1], value[1:])
    behavior = -torch.rand(T, N, generator=g, dtype=dtype) * 3
    target = behavior + randn() * 0.5
    return Rollout(
        reward=randn(),
        value=value,
        next_value=next_value,
        done=terminated | truncated,
        terminated=terminated,
        behavior_log_prob=behavior,
        target_log_prob=target,
    )
