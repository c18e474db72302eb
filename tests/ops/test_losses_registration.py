"""The loss ops as PyTorch custom operators: opcheck, compile with no graph break (forward and
backward), nothing dispatched that could sync, and the linear variant's bounded memory."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nostall
import nostall.ops
from tests.ops.losses_data import grouped_rewards, logits_batch, token_batch

ops = torch.ops.nostall


def _grad(x):
    return x.detach().clone().requires_grad_(True)


def op_cases(device):
    reward, index = grouped_rewards([3, 1, 4], seed=1)
    reward, index = reward.to(device), index.to(device)
    logits, tokens = logits_batch(2, 3, 17, torch.float64, seed=2)
    logits, tokens = logits.to(device), tokens.to(device)
    lp_tok, lse = ops.token_log_prob(logits, tokens)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 3, 5, generator=g, dtype=torch.float64).to(device)
    weight = torch.randn(17, 5, generator=g, dtype=torch.float64).to(device)
    _, lin_lse = ops.token_log_prob_linear(hidden, weight, tokens, 4)
    lp, old, beh, adv, mask = (t.to(device) for t in token_batch(3, 5, seed=4))
    loss_tail = (0.2, 0.28, "seq_mean_token_mean", 6, 3.0, beh, 2.0)
    one = torch.ones((), dtype=torch.float64, device=device)
    return {
        "group_advantages": (ops.group_advantages, (_grad(reward), index, 3, "group", 1e-4)),
        "group_advantages_backward": (
            ops.group_advantages_backward,
            (torch.randn_like(reward), reward, index, 3, "batch", 1e-4),
        ),
        "token_log_prob": (ops.token_log_prob, (_grad(logits), tokens)),
        "token_log_prob_backward": (
            ops.token_log_prob_backward,
            (torch.randn_like(lp_tok), logits, tokens, lse),
        ),
        "token_log_prob_linear": (
            ops.token_log_prob_linear,
            (_grad(hidden), _grad(weight), tokens, 4),
        ),
        "token_log_prob_linear_backward": (
            ops.token_log_prob_linear_backward,
            (torch.randn_like(lin_lse), hidden, weight, tokens, lin_lse, 4),
        ),
        "clipped_policy_loss": (ops.clipped_policy_loss, (_grad(lp), old, adv, mask, *loss_tail)),
        "clipped_policy_loss_no_options": (
            ops.clipped_policy_loss,
            (_grad(lp), old, adv, mask, 0.2, 0.2, "token_mean", 5, None, None, 2.0),
        ),
        "clipped_policy_loss_backward": (
            ops.clipped_policy_loss_backward,
            (
                one,
                ops.clipped_policy_loss(lp, old, adv, mask, *loss_tail)[3],
                mask,
                "token_mean",
                6,
            ),
        ),
    }


CASES = list(op_cases("cpu"))


@pytest.mark.parametrize("name", CASES)
def test_opcheck(device, name):
    op, args = op_cases(device)[name]
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result


def grpo_step(hidden, weight, tokens, old_lp, reward, index, mask):
    adv = nostall.group_advantages(reward, index, 4)
    lp = nostall.token_log_prob_linear(hidden, weight, tokens, chunk_size=8)
    out = nostall.clipped_policy_loss(lp, old_lp, adv, mask, 0.2, 0.28, "seq_mean_token_mean")
    return out.loss, out.clip_fraction, out.approx_kl


def grpo_inputs(device="cpu"):
    g = torch.Generator().manual_seed(5)
    B, T, H, V = 8, 6, 12, 40
    hidden = torch.randn(B, T, H, generator=g).to(device).requires_grad_()
    weight = torch.randn(V, H, generator=g).to(device).requires_grad_()
    tokens = torch.randint(0, V, (B, T), generator=g).to(device)
    old_lp = nostall.token_log_prob_linear(hidden, weight, tokens).detach() + 0.1
    reward = torch.randn(B, generator=g).to(device)
    index = torch.arange(4).repeat_interleave(2).to(device)
    mask = (torch.rand(B, T, generator=g) < 0.8).to(device)
    return hidden, weight, tokens, old_lp, reward, index, mask


def test_compiled_grpo_step_has_no_graph_break_and_matches_eager(device):
    torch._dynamo.reset()
    args = grpo_inputs(device)
    assert torch._dynamo.explain(grpo_step)(*args).graph_break_count == 0
    compiled = torch.compile(grpo_step, fullgraph=True)
    eager_out = grpo_step(*args)
    eager_out[0].backward()
    eager_grads = [args[0].grad.clone(), args[1].grad.clone()]
    args[0].grad = args[1].grad = None
    comp_out = compiled(*args)
    comp_out[0].backward()
    for a, b in zip(comp_out, eager_out, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(args[0].grad, eager_grads[0])
    torch.testing.assert_close(args[1].grad, eager_grads[1])


def test_compiled_token_log_prob_backward_matches_eager():
    torch._dynamo.reset()
    logits, tokens = logits_batch(3, 4, 30, seed=6)

    def f(x):
        return (nostall.token_log_prob(x, tokens) ** 2).sum()

    a, b = _grad(logits), _grad(logits)
    f(a).backward()
    torch.compile(f, fullgraph=True)(b).backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_statistics_outputs_are_not_differentiable():
    lp, old, _beh, adv, mask = token_batch(2, 4, seed=7)
    out = nostall.clipped_policy_loss(_grad(lp), old, adv, mask)
    assert out.loss.requires_grad
    assert not out.clip_fraction.requires_grad and not out.approx_kl.requires_grad
    logits, tokens = logits_batch(2, 2, 5, seed=8)
    _, lse = ops.token_log_prob(_grad(logits), tokens)
    assert not lse.requires_grad


class _OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_step_dispatches_nothing_that_syncs():
    # Forward and backward of a GRPO step are the native ops and autograd's own bookkeeping:
    # no item(), nonzero() or host copy anywhere (normalisers stay on the device).
    args = grpo_inputs()
    recorder = _OpRecorder()
    with recorder:
        loss, _, _ = grpo_step(*args)
        loss.backward()
    native = [c for c in recorder.calls if c.startswith("nostall.")]
    assert native == [
        "nostall.group_advantages.default",
        "nostall.token_log_prob_linear.default",
        "nostall.clipped_policy_loss.default",
        "nostall.clipped_policy_loss_backward.default",
        "nostall.token_log_prob_linear_backward.default",
    ]
    others = {c for c in recorder.calls if not c.startswith("nostall.")}
    assert others <= {"aten.ones_like.default", "aten.detach.default"}, others


_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, nostall
    from nostall.ops import reference
    fn = {"nostall": lambda h, w, t: nostall.token_log_prob_linear(h, w, t, chunk_size=128),
          "reference": reference.token_log_prob_linear}[sys.argv[1]]
    def inputs(B, T, H, V):
        g = torch.Generator().manual_seed(0)
        hidden = torch.randn(B, T, H, generator=g).requires_grad_()
        weight = (torch.randn(V, H, generator=g) * 0.1).requires_grad_()
        return hidden, weight, torch.randint(0, V, (B, T), generator=g)
    # Warm-up on a small problem: libraries and thread pools load before the baseline.
    fn(*inputs(1, 8, 64, 8192)).sum().backward()
    big = inputs(4, 512, 64, 8192)
    def status_kib(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the high-water mark (VmHWM) to the current resident size
    before = status_kib("VmRSS")
    fn(*big).sum().backward()
    print(json.dumps({"peak_kib": status_kib("VmHWM") - before}))
    """
)


def _peak_kib(which):
    # A fresh process per measurement, reading Linux's per-process high-water mark (VmHWM; not
    # getrusage's ru_maxrss, which a process inherits from its parent across exec). A fixed mmap
    # threshold makes glibc map every large tensor on its own and unmap it when freed, so the
    # resident size follows the live tensors (with its default, adaptive threshold, freed
    # blocks stay in the heap and the peak depends on the allocation history).
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, which],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_kib"]


@pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"), reason="reads Linux's /proc peak resident size"
)
def test_linear_variant_peak_memory_is_far_below_the_full_logits():
    # B*T*V float32 logits are 64 MiB here, and the reference holds more than that at its
    # peak (checked, so the measurement is known to see it). Ours, 128 rows of logits (4 MiB)
    # at a time, stays under a quarter.
    logits_kib = 4 * 512 * 8192 * 4 // 1024
    assert _peak_kib("reference") > logits_kib
    ours = _peak_kib("nostall")
    assert ours < logits_kib // 4, (ours, logits_kib)


def test_second_derivatives_are_refused_not_silently_zero():
    logits, tokens = logits_batch(2, 3, 9, torch.float64, seed=9)
    x = _grad(logits)
    with pytest.raises(RuntimeError, match="token_log_prob has no second derivative"):
        torch.autograd.grad(nostall.token_log_prob(x, tokens).sum(), x, create_graph=True)
    g = torch.Generator().manual_seed(10)
    h = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="token_log_prob_linear has no second derivative"):
        torch.autograd.grad(nostall.token_log_prob_linear(h, w, tokens).sum(), h, create_graph=True)
    reward, index = grouped_rewards([3, 2], seed=11)
    r = _grad(reward)
    with pytest.raises(RuntimeError, match="group_advantages has no second derivative"):
        torch.autograd.grad(
            (nostall.group_advantages(r, index, 2) ** 2).sum(), r, create_graph=True
        )
    lp, old, _, adv, mask = token_batch(2, 4, seed=12)
    lp = _grad(lp)
    with pytest.raises(RuntimeError, match="clipped_policy_loss has no second derivative"):
        loss = nostall.clipped_policy_loss(lp, old, adv, mask).loss
        torch.autograd.grad(loss, lp, create_graph=True)
    # A first derivative with create_graph=False is of course fine.
    torch.autograd.grad(nostall.token_log_prob(x, tokens).sum(), x)


@pytest.mark.parametrize("target", ["old_log_prob", "advantage", "behavior_log_prob"])
def test_targets_that_require_grad_are_refused(target):
    lp, old, beh, adv, mask = token_batch(2, 4, seed=12)
    args = dict(old_log_prob=old, advantage=adv, behavior_log_prob=beh)
    args[target] = _grad(args[target])
    with pytest.raises(RuntimeError, match=f"{target} must not require grad"):
        nostall.clipped_policy_loss(_grad(lp), mask=mask, **args)
    with torch.no_grad():  # without autograd recording, nothing to refuse
        nostall.clipped_policy_loss(lp, mask=mask, **args)
