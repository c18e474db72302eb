"""Pure-PyTorch references for the native ops: plain loops written from the papers' equations,
kept deliberately simple so the native kernels can be checked against them.

All tensors are time-major `[T, N]`; see `nostall.ops.advantages` for the conventions.
"""

import torch

Tensor = torch.Tensor


def gae(reward, value, next_value, done, terminated, gamma, lmbda) -> tuple[Tensor, Tensor]:
    not_done = (~done).to(reward.dtype)
    not_terminated = (~terminated).to(reward.dtype)
    delta = reward + gamma * not_terminated * next_value - value  # (T, N)
    advantage = torch.zeros_like(reward)
    carry = torch.zeros_like(reward[0])  # (N,)
    for t in reversed(range(reward.shape[0])):
        carry = delta[t] + gamma * lmbda * not_done[t] * carry
        advantage[t] = carry
    return advantage, advantage + value


def discounted_returns(reward, done, terminated, bootstrap_value, gamma) -> Tensor:
    returns = torch.zeros_like(reward)
    following = torch.zeros_like(reward[0])  # returns[t + 1], (N,)
    last = reward.shape[0] - 1
    for t in reversed(range(reward.shape[0])):
        cut = done[t] | (t == last)
        nxt = torch.where(cut, bootstrap_value[t], following)
        following = reward[t] + gamma * (~terminated[t]).to(reward.dtype) * nxt
        returns[t] = following
    return returns


def vtrace(
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
) -> tuple[Tensor, Tensor]:
    ratio = (target_log_prob - behavior_log_prob).exp()
    rho = ratio.clamp(max=rho_bar)
    c = ratio.clamp(max=c_bar)
    not_terminated = (~terminated).to(reward.dtype)
    delta = rho * (reward + gamma * not_terminated * next_value - value)
    last = reward.shape[0] - 1
    vs_minus_v = torch.zeros_like(reward)
    acc = torch.zeros_like(reward[0])
    for t in reversed(range(reward.shape[0])):
        cut = done[t] | (t == last)
        acc = delta[t] + gamma * c[t] * torch.where(cut, torch.zeros_like(acc), acc)
        vs_minus_v[t] = acc
    value_target = vs_minus_v + value
    following = torch.cat([value_target[1:], next_value[-1:]])  # v_s[t + 1]
    is_last = torch.zeros_like(done)
    is_last[-1] = True
    next_vs = torch.where(done | is_last, next_value, following)
    pg_advantage = rho * (reward + gamma * not_terminated * next_vs - value)
    return value_target, pg_advantage
