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


def group_advantages(reward, group_index, num_groups, scale="group", eps=1e-4) -> Tensor:
    """GRPO / Dr. GRPO group advantages with index_add: unbiased std, 0 for a group of one."""
    zeros = reward.new_zeros(num_groups)
    count = zeros.index_add(0, group_index, torch.ones_like(reward))
    mean = zeros.index_add(0, group_index, reward) / count.clamp(min=1)
    centred = reward - mean[group_index]
    if scale == "none":
        return centred
    if scale == "group":
        sq = zeros.index_add(0, group_index, centred**2)
        var = torch.where(count > 1, sq / (count - 1).clamp(min=1), torch.zeros_like(sq))
        std = var.sqrt()[group_index]
    else:
        std = reward.std() if reward.numel() > 1 else reward.new_zeros(())
        std = std.expand_as(reward)
    divisor = std + eps
    return torch.where(divisor > 0, centred / divisor, torch.zeros_like(centred))


def token_log_prob(logits, tokens) -> Tensor:
    """log_softmax over the full `[B, T, V]` logits (float32 accumulation), then gather."""
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    log_probs = torch.log_softmax(logits.to(acc), dim=-1)
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def token_log_prob_linear(hidden, weight, tokens) -> Tensor:
    return token_log_prob(hidden @ weight.T, tokens)


def token_entropy_linear(hidden, weight) -> Tensor:
    """The entropy of torch.distributions.Categorical over the full logits (float32
    accumulation)."""
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    logits = (hidden @ weight.T).to(acc)
    return torch.distributions.Categorical(logits=logits).entropy()


def clipped_policy_loss(
    log_prob,
    old_log_prob,
    advantage,
    mask,
    clip_low,
    clip_high,
    aggregation,
    max_tokens,
    dual_clip=None,
    behavior_log_prob=None,
    is_cap=2.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """The clipped surrogate written out token by token, masked with where (so masked NaN stays
    out), and aggregated as nostall.clipped_policy_loss documents."""
    adv = advantage if advantage.dim() == 2 else advantage.unsqueeze(1).expand_as(log_prob)
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    clipped_ratio = ratio.clamp(1 - clip_low, 1 + clip_high)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)
    clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual = (adv < 0) & (per_token > cap)
        per_token = torch.where(dual, cap, per_token)
        clipped = clipped | dual
    if behavior_log_prob is not None:
        weight = (old_log_prob - behavior_log_prob).exp().clamp(max=is_cap)
        per_token = per_token * weight.detach()
    zero = torch.zeros_like(per_token)
    per_token = torch.where(mask, per_token, zero)
    tokens = mask.sum().clamp(min=1).to(log_prob.dtype)
    if aggregation == "token_mean":
        loss = per_token.sum() / tokens
    elif aggregation == "seq_mean_token_mean":
        loss = (per_token.sum(1) / mask.sum(1).clamp(min=1).to(log_prob.dtype)).mean()
    else:
        loss = per_token.sum() / (log_prob.shape[0] * max_tokens)
    clip_fraction = torch.where(mask, clipped.to(log_prob.dtype), zero).sum() / tokens
    kl = torch.where(mask, (ratio - 1) - log_ratio, zero).sum() / tokens
    return loss, clip_fraction.detach(), kl.detach()


def mlp(input, weights, biases, activation="tanh") -> Tensor:
    """The plain nn.functional form of nostall.mlp."""
    act = torch.tanh if activation == "tanh" else torch.relu
    x = input
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        x = torch.nn.functional.linear(x, w, b)
        if i + 1 < len(weights):
            x = act(x)
    return x


def ppo_loss(
    logits,
    action,
    value,
    old_log_prob,
    old_value,
    advantage,
    value_target,
    clip_coef=0.2,
    value_clip=0.2,
    ent_coef=0.01,
    vf_coef=0.5,
    normalize_advantage=True,
) -> tuple[Tensor, ...]:
    """CleanRL's ppo.py loss, op by op: (loss, pg_loss, v_loss, entropy, approx_kl,
    clip_fraction)."""
    log_p = logits.log_softmax(-1)
    new_log_prob = log_p.gather(-1, action[:, None]).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return ppo_loss_from_log_prob(
        new_log_prob,
        entropy,
        value,
        old_log_prob,
        old_value,
        advantage,
        value_target,
        clip_coef,
        value_clip,
        ent_coef,
        vf_coef,
        normalize_advantage,
    )


def ppo_loss_from_log_prob(
    new_log_prob,
    entropy,
    value,
    old_log_prob,
    old_value,
    advantage,
    value_target,
    clip_coef=0.2,
    value_clip=0.2,
    ent_coef=0.01,
    vf_coef=0.5,
    normalize_advantage=True,
) -> tuple[Tensor, ...]:
    """The same loss from the policy's log-probabilities and entropies."""
    adv = advantage
    if normalize_advantage:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    log_ratio = new_log_prob - old_log_prob
    ratio = log_ratio.exp()
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    if value_clip is None:
        v_err = (value - value_target) ** 2
    else:
        clipped = old_value + (value - old_value).clamp(-value_clip, value_clip)
        v_err = torch.max((value - value_target) ** 2, (clipped - value_target) ** 2)
    pg_loss, v_loss = pg.mean(), 0.5 * v_err.mean()
    loss = pg_loss - ent_coef * entropy.mean() + vf_coef * v_loss
    with torch.no_grad():
        kl = ((ratio - 1) - log_ratio).mean()
        cut = ((ratio < 1 - clip_coef) & (adv < 0)) | ((ratio > 1 + clip_coef) & (adv > 0))
        clip_fraction = cut.to(new_log_prob.dtype).mean()
    return loss, pg_loss.detach(), v_loss.detach(), entropy.mean().detach(), kl, clip_fraction


def sample_tokens(
    logits, uniform, finished, allowed, temperature, top_k, top_p, eos_token_id, pad_token_id
) -> tuple[Tensor, Tensor, Tensor]:
    """(token, log_prob, finished after the step): temperature, HF-style top-k then top-p (on
    the top-k renormalised distribution), Gumbel-max with the given noise; the log-prob under
    the distribution before truncation."""
    x = (logits / temperature).masked_fill(~allowed, float("-inf"))
    policy = x  # the log-prob is the untruncated policy's
    if top_k > 0:
        kth = x.topk(min(top_k, x.shape[-1]), dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, _ = x.sort(-1, descending=True)
        probs = sorted_x.double().softmax(-1)
        reach = probs.cumsum(-1) >= top_p * probs.sum(-1, keepdim=True)
        reach[..., -1] = True  # the whole mass reaches any top_p <= 1
        last = reach.float().argmax(-1, keepdim=True)  # the first value reaching top_p
        threshold = sorted_x.gather(-1, last)
        x = x.masked_fill(x < threshold, float("-inf"))
    gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20)))
    token = torch.where(torch.isinf(x), float("-inf"), x + gumbel).argmax(-1)
    log_prob = policy.log_softmax(-1).gather(-1, token[:, None])[:, 0]
    token = torch.where(finished, pad_token_id, token)
    log_prob = torch.where(finished, 0.0, log_prob)
    return token, log_prob, finished | (token == eos_token_id)
