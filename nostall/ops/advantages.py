"""Advantage and return estimators over time-major rollouts, as native custom operators.

Every tensor is time-major `[T, N]` (T steps of N environments), float32 or float64; the flags
`done` and `terminated` are bool `[T, N]`. Conventions follow Gymnasium: `terminated[t]` means
step t reached a terminal state (no bootstrap), `done[t] = terminated[t] | truncated[t]` means
the next row belongs to a new episode. `next_value[t]` is the critic's value of the observation
reached by step t (the final observation when the episode was truncated), so truncation is
handled exactly.

The ops run on the device of their inputs, never synchronise with the host, trace under
`torch.compile(fullgraph=True)`, and batch under `torch.vmap` with one native call.
"""

import torch

Tensor = torch.Tensor


def _tensors(**named: object) -> None:
    """Tensor arguments given as something else (None) would reach the dispatcher, whose error
    ("tensor does not have a device") names none of them: each is refused by name."""
    for name, value in named.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")


def _scalar(x: float, name: str) -> float:
    # A tensor here would need float(tensor), a host-device sync on every call: refuse it.
    if isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a Python number, not a tensor")
    return float(x)


def gae(
    reward: Tensor,
    value: Tensor,
    next_value: Tensor,
    done: Tensor,
    terminated: Tensor,
    gamma: float = 0.99,
    lmbda: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016).

    Args:
        reward: `[T, N]` rewards.
        value: `[T, N]` critic values V(s_t).
        next_value: `[T, N]` critic values of the state after each step.
        done: bool `[T, N]`, episode ended at step t (terminated or truncated).
        terminated: bool `[T, N]`, step t reached a terminal state (no bootstrap).
        gamma: discount in [0, 1].
        lmbda: GAE lambda in [0, 1].

    Returns:
        `(advantage, value_target)`, each `[T, N]` with the dtype of `reward`, where
        `value_target = advantage + value`. Differentiable in reward, value and next_value.
    """
    _tensors(reward=reward, value=value, next_value=next_value, done=done, terminated=terminated)
    return torch.ops.nostall.gae.default(
        reward,
        value,
        next_value,
        done,
        terminated,
        _scalar(gamma, "gamma"),
        _scalar(lmbda, "lmbda"),
    )


def discounted_returns(
    reward: Tensor,
    done: Tensor,
    terminated: Tensor,
    bootstrap_value: Tensor,
    gamma: float = 0.99,
) -> Tensor:
    """Discounted returns `G[t] = reward[t] + gamma * G[t + 1]`, cut at episode boundaries.

    Args:
        reward: `[T, N]` rewards.
        done: bool `[T, N]`, episode ended at step t.
        terminated: bool `[T, N]`, step t reached a terminal state (no bootstrap).
        bootstrap_value: `[T, N]` value of the state after each step; read only where the
            return is cut without termination (truncation, and the last step T - 1).
        gamma: discount in [0, 1].

    Returns:
        `[T, N]` returns with the dtype of `reward`. Differentiable in reward and
        bootstrap_value. Equal to `gae(..., lmbda=1)[1]` with `next_value = bootstrap_value`.
    """
    _tensors(reward=reward, done=done, terminated=terminated, bootstrap_value=bootstrap_value)
    return torch.ops.nostall.discounted_returns.default(
        reward, done, terminated, bootstrap_value, _scalar(gamma, "gamma")
    )


def vtrace(
    behavior_log_prob: Tensor,
    target_log_prob: Tensor,
    reward: Tensor,
    value: Tensor,
    next_value: Tensor,
    done: Tensor,
    terminated: Tensor,
    gamma: float = 0.99,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace off-policy targets (Espeholt et al. 2018, IMPALA).

    Args:
        behavior_log_prob: `[T, N]` log-probability of each action under the policy that acted.
        target_log_prob: `[T, N]` log-probability of the same actions under the learner policy.
        reward, value, next_value, done, terminated: as in :func:`gae`.
        gamma: discount in [0, 1].
        rho_bar: clip of the importance weight in the TD error and the policy-gradient term, > 0.
        c_bar: clip of the trace-cutting weight, > 0.

    Returns:
        `(value_target, pg_advantage)`, each `[T, N]`: the V-trace targets v_s and the
        importance-weighted policy-gradient advantages. Not differentiable: both are targets.
    """
    _tensors(
        behavior_log_prob=behavior_log_prob,
        target_log_prob=target_log_prob,
        reward=reward,
        value=value,
        next_value=next_value,
        done=done,
        terminated=terminated,
    )
    return torch.ops.nostall.vtrace.default(
        behavior_log_prob,
        target_log_prob,
        reward,
        value,
        next_value,
        done,
        terminated,
        _scalar(gamma, "gamma"),
        _scalar(rho_bar, "rho_bar"),
        _scalar(c_bar, "c_bar"),
    )
