"""One GRPO update step on a toy language-model head, with nostall's loss operators, compiled
with fullgraph=True (no graph break) and no host sync between the rewards and the gradients.

    python examples/grpo_step.py

A batch holds G completions for each of P prompts (groups may differ in size; here they do not).
The step: group-relative advantages from the rewards, the completion tokens' log-probabilities
from the final hidden states and the output weight (logits a chunk at a time, never all at
once), and the clipped surrogate aggregated as Dr. GRPO does.
"""

import torch

import nostall

P, G, T, H, V = 4, 8, 64, 128, 32000  # prompts, completions per prompt, tokens, hidden, vocab
B = P * G


def grpo_loss(hidden, weight, tokens, old_log_prob, reward, group_index, mask):
    advantage = nostall.group_advantages(reward, group_index, P, scale="none")  # Dr. GRPO
    log_prob = nostall.token_log_prob_linear(hidden, weight, tokens)
    return nostall.clipped_policy_loss(
        log_prob,
        old_log_prob,
        advantage,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        aggregation="seq_mean_token_sum_norm",
        max_tokens=T,
    )


def main() -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g, requires_grad=True)  # stands for the model
    weight = (torch.randn(V, H, generator=g) / H**0.5).requires_grad_()
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.randint(T // 4, T + 1, (B, 1), generator=g)
    mask = torch.arange(T) < lengths  # padding after each completion's end
    reward = (torch.rand(B, generator=g) < 0.5).float()  # e.g. a verifier's 0/1 reward
    group_index = torch.arange(P).repeat_interleave(G)
    with torch.no_grad():  # the policy that generated the data: here, the same weights
        old_log_prob = nostall.token_log_prob_linear(hidden, weight, tokens)

    step = torch.compile(grpo_loss, fullgraph=True)
    out = step(hidden, weight, tokens, old_log_prob, reward, group_index, mask)
    out.loss.backward()
    # sync: reading the results for printing, once, at the end.
    print(
        f"loss {out.loss.item():.4f}  clip fraction {out.clip_fraction.item():.3f}  "
        f"approx KL {out.approx_kl.item():.2e}  |grad weight| {weight.grad.norm().item():.4f}"
    )


if __name__ == "__main__":
    main()
