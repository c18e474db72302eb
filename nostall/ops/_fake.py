"""Fake (meta) kernels: output metadata without data, so `torch.compile(fullgraph=True)` and
export trace the native ops with no graph break. Outputs are contiguous, as the C++ kernels'."""

import torch

from nostall.ops import _checks as c

Tensor = torch.Tensor


def _new(like: Tensor) -> Tensor:
    return like.new_empty(like.shape)


@torch.library.register_fake("nostall::gae")
def _gae_fake(reward, value, next_value, done, terminated, gamma, lmbda):
    c.check_time_major(reward, "reward")
    c.check_like(value, "value", reward, "reward")
    c.check_like(next_value, "next_value", reward, "reward")
    c.check_flags(done, "done", reward, "reward")
    c.check_flags(terminated, "terminated", reward, "reward")
    c.check_unit_interval(gamma, "gamma")
    c.check_unit_interval(lmbda, "lmbda")
    return _new(reward), _new(reward)


@torch.library.register_fake("nostall::gae_backward")
def _gae_backward_fake(grad_advantage, grad_value_target, done, terminated, gamma, lmbda):
    c.check_time_major(grad_advantage, "grad_advantage")
    c.check_like(grad_value_target, "grad_value_target", grad_advantage, "grad_advantage")
    c.check_flags(done, "done", grad_advantage, "grad_advantage")
    c.check_flags(terminated, "terminated", grad_advantage, "grad_advantage")
    c.check_unit_interval(gamma, "gamma")
    c.check_unit_interval(lmbda, "lmbda")
    return _new(grad_advantage), _new(grad_advantage), _new(grad_advantage)


@torch.library.register_fake("nostall::discounted_returns")
def _discounted_returns_fake(reward, done, terminated, bootstrap_value, gamma):
    c.check_time_major(reward, "reward")
    c.check_flags(done, "done", reward, "reward")
    c.check_flags(terminated, "terminated", reward, "reward")
    c.check_like(bootstrap_value, "bootstrap_value", reward, "reward")
    c.check_unit_interval(gamma, "gamma")
    return _new(reward)


@torch.library.register_fake("nostall::discounted_returns_backward")
def _discounted_returns_backward_fake(grad_returns, done, terminated, gamma):
    c.check_time_major(grad_returns, "grad_returns")
    c.check_flags(done, "done", grad_returns, "grad_returns")
    c.check_flags(terminated, "terminated", grad_returns, "grad_returns")
    c.check_unit_interval(gamma, "gamma")
    return _new(grad_returns), _new(grad_returns)


@torch.library.register_fake("nostall::vtrace")
def _vtrace_fake(
    behavior_log_prob,
    target_log_prob,
    reward,
    value,
    next_value,
    done,
    terminated,
    gamma,
    rho_bar,
    c_bar,
):
    c.check_time_major(reward, "reward")
    c.check_like(behavior_log_prob, "behavior_log_prob", reward, "reward")
    c.check_like(target_log_prob, "target_log_prob", reward, "reward")
    c.check_like(value, "value", reward, "reward")
    c.check_like(next_value, "next_value", reward, "reward")
    c.check_flags(done, "done", reward, "reward")
    c.check_flags(terminated, "terminated", reward, "reward")
    c.check_unit_interval(gamma, "gamma")
    c.check_positive(rho_bar, "rho_bar")
    c.check_positive(c_bar, "c_bar")
    return _new(reward), _new(reward)
