"""Soft-capped log-probs and entropies (nostall/lm/softcap.py) against the full [B, T, V]
computation in float64, values and gradients, over several chunks and temperatures."""

import pytest
import torch

from nostall.lm import softcap


def _reference(hidden, weight, tokens, cap, temperature):
    raw = (hidden.double() * temperature) @ weight.double().T
    log_p = (cap * torch.tanh(raw / cap) / temperature).log_softmax(-1)
    return log_p.gather(-1, tokens[..., None])[..., 0], -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_and_entropies_are_the_full_computation(monkeypatch, temperature):
    monkeypatch.setattr(softcap, "CHUNK_LOGITS", 3 * 50)  # 3 rows a chunk: 4 chunks of 11 rows
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(1, 11, 16, generator=g) * 3).requires_grad_()
    weight = torch.randn(50, 16, generator=g).requires_grad_()
    tokens = torch.randint(0, 50, (1, 11), generator=g)
    log_prob = softcap.softcapped_token_log_prob(hidden, weight, tokens, 5.0, temperature)
    entropy = softcap.softcapped_token_entropy(hidden, weight, 5.0, temperature)
    want_lp, want_h = _reference(hidden, weight, tokens, 5.0, temperature)
    assert log_prob.dtype == entropy.dtype == torch.float32 and log_prob.shape == (1, 11)
    torch.testing.assert_close(log_prob.double(), want_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy.double(), want_h, rtol=0, atol=1e-5)
    upstream = torch.randn(2, 1, 11, generator=g)
    mine = torch.autograd.grad(
        (log_prob * upstream[0]).sum() + (entropy * upstream[1]).sum(), (hidden, weight)
    )
    theirs = torch.autograd.grad(
        (want_lp * upstream[0]).sum() + (want_h * upstream[1]).sum(), (hidden, weight)
    )
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_a_cap_must_be_positive():
    with pytest.raises(ValueError, match="cap must be positive"):
        softcap.softcapped_token_log_prob(
            torch.zeros(2, 4), torch.zeros(3, 4), torch.zeros(2, dtype=torch.long), 0.0
        )
