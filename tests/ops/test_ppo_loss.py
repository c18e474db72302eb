"""ppo_loss: against the op-by-op PyTorch loss (forward, stats and gradients), gradcheck,
opcheck, compile, argument errors in eager and fake mode, and hypothesis-drawn minibatches."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nostall
from nostall.ops import reference

ops = torch.ops.nostall
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def minibatch(M, A, dtype=torch.float64, seed=0, spread=0.5):
    """(logits, action, value, old_log_prob, old_value, advantage, value_target), with old
    log-probabilities and values `spread` away from the current ones so that clips bite."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(M, A, generator=g, dtype=dtype)
    action = torch.randint(0, A, (M,), generator=g)
    value = torch.randn(M, generator=g, dtype=dtype)
    log_p = logits.log_softmax(-1).gather(-1, action[:, None]).squeeze(-1)
    old_log_prob = log_p + spread * torch.randn(M, generator=g, dtype=dtype)
    old_value = value + spread * torch.randn(M, generator=g, dtype=dtype)
    advantage = torch.randn(M, generator=g, dtype=dtype) * 3 + 1
    value_target = torch.randn(M, generator=g, dtype=dtype)
    return logits, action, value, old_log_prob, old_value, advantage, value_target


def _diff(batch):
    logits, action, value, *rest = batch
    return (logits.clone().requires_grad_(True), action, value.clone().requires_grad_(True), *rest)


def _check_against_reference(batch, options, dtype):
    ours_in, ref_in = _diff(batch), _diff(batch)
    ours = nostall.ppo_loss(*ours_in, **options)
    want = reference.ppo_loss(*ref_in, **options)
    for got, expected in zip(ours[:6], want, strict=True):  # (ours[6] is the stats vector)
        torch.testing.assert_close(got, expected, **TOL[dtype])
    ours.loss.backward()
    want[0].backward()
    for i in (0, 2):  # logits, value
        torch.testing.assert_close(ours_in[i].grad, ref_in[i].grad, **TOL[dtype])


OPTIONS = [
    dict(),
    dict(value_clip=None, normalize_advantage=False),
    dict(clip_coef=0.1, value_clip=0.5, ent_coef=0.0, vf_coef=1.0),
    dict(clip_coef=0.3, value_clip=0.05, ent_coef=0.1, vf_coef=0.25, normalize_advantage=False),
]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_the_op_by_op_loss(options, dtype):
    batch = minibatch(256, 3, dtype, seed=1)
    _check_against_reference(batch, options, dtype)
    out = nostall.ppo_loss(*batch, **options)
    assert 0 < float(out.clip_fraction) < 1  # the clip really bites in this data


@settings(max_examples=40, deadline=None)
@given(
    M=st.integers(2, 70),
    A=st.integers(1, 9),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
    spread=st.floats(0.0, 2.0),
    options=st.sampled_from(OPTIONS),
)
def test_any_minibatch_matches_the_op_by_op_loss(M, A, dtype, seed, spread, options):
    _check_against_reference(minibatch(M, A, dtype, seed, spread), options, dtype)


def test_gradcheck():
    logits, action, value, *targets = minibatch(12, 4, seed=2, spread=0.3)

    def loss(logits, value):
        return nostall.ppo_loss(logits, action, value, *targets, value_clip=0.3).loss

    assert torch.autograd.gradcheck(loss, (logits.requires_grad_(), value.requires_grad_()))


def test_opcheck_and_compile_forward_and_backward():
    batch = minibatch(16, 3, seed=3)
    args = (*_diff(batch), 0.2, 0.2, 0.01, 0.5, True)
    torch.library.opcheck(ops.ppo_loss.default, args)
    torch.library.opcheck(ops.ppo_loss.default, (*_diff(batch), 0.2, None, 0.0, 1.0, False))
    grads = ops.ppo_loss(*args)[2:]
    torch.library.opcheck(ops.ppo_loss_backward.default, (torch.tensor(1.5).double(), *grads))

    def step(logits, value):
        out = nostall.ppo_loss(logits, batch[1], value, *batch[3:])
        return out.loss, out.clip_fraction

    eager_in, compiled_in = _diff(batch), _diff(batch)
    want = step(eager_in[0], eager_in[2])
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(compiled_in[0], compiled_in[2])
    torch.testing.assert_close(got, want)
    want[0].backward()
    got[0].backward()  # through the compiled graph's backward
    torch.testing.assert_close(compiled_in[0].grad, eager_in[0].grad)
    torch.testing.assert_close(compiled_in[2].grad, eager_in[2].grad)


def test_no_grad_gives_the_same_loss():
    batch = minibatch(32, 2, torch.float32, seed=4)
    with torch.no_grad():
        quiet = nostall.ppo_loss(*_diff(batch))
    torch.testing.assert_close(quiet.loss, nostall.ppo_loss(*_diff(batch)).loss.detach())
    assert quiet.loss.grad_fn is None


def _bad_cases():
    logits, action, value, olp, ov, adv, tgt = minibatch(4, 3)
    ok = [logits, action, value, olp, ov, adv, tgt, 0.2, 0.2, 0.01, 0.5, True]

    def with_(i, x):
        args = list(ok)
        args[i] = x
        return args

    return [
        (with_(0, logits[0]), "logits must be \\[M, A\\]"),
        (with_(0, logits.int()), "logits must be float32 or float64"),
        (with_(1, action.int()), "action must be int64 \\[M\\] = \\[4\\]"),
        (with_(1, action[:3]), "action must be int64 \\[M\\] = \\[4\\]"),
        (with_(2, value[:2]), "value must be \\[M\\] = \\[4\\]"),
        (with_(3, olp.float()), "old_log_prob must have the dtype of logits"),
        (with_(5, adv[:, None]), "advantage must be \\[M\\] = \\[4\\]"),
        (with_(6, tgt.float()), "value_target must have the dtype of logits"),
        (with_(7, -0.1), "clip_coef must be a finite number >= 0"),
        (with_(8, float("nan")), "value_clip must be None or a finite number >= 0"),
        (with_(9, float("inf")), "ent_coef must be finite"),
        (with_(10, float("nan")), "vf_coef must be finite"),
        (
            [logits[:1], action[:1], *(t[:1] for t in (value, olp, ov, adv, tgt)), *ok[7:]],
            "normalize_advantage needs at least 2 samples",
        ),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_arguments_are_named_in_eager_and_fake_mode(case):
    args, message = _bad_cases()[case]
    with pytest.raises(RuntimeError, match=message):
        ops.ppo_loss(*args)
    with pytest.raises(RuntimeError, match=message), torch._subclasses.FakeTensorMode() as mode:
        ops.ppo_loss(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])


def test_out_of_range_actions_targets_with_grad_and_double_backward_are_refused():
    logits, action, value, olp, ov, adv, tgt = minibatch(5, 3)
    with pytest.raises(RuntimeError, match="action must lie in \\[0, A = 3\\), got action\\[2\\]"):
        bad = action.index_fill(0, torch.tensor([2]), 3)
        nostall.ppo_loss(logits, bad, value, olp, ov, adv, tgt)
    with pytest.raises(RuntimeError, match="advantage must not require grad"):
        nostall.ppo_loss(logits, action, value, olp, ov, adv.requires_grad_(), tgt)
    logits, value = logits.requires_grad_(), value.requires_grad_()
    out = nostall.ppo_loss(logits, action, value, olp, ov, adv.detach(), tgt)
    with pytest.raises(RuntimeError, match="ppo_loss has no second derivative"):
        torch.autograd.grad(out.loss, logits, create_graph=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
@pytest.mark.parametrize("M", [7, 256, 1000])
def test_cuda_matches_cpu_without_sync(M):
    batch = minibatch(M, 4, torch.float32, seed=5)
    cpu_in, gpu_in = _diff(batch), [t.cuda() for t in _diff(batch)]
    for i in (0, 2):
        gpu_in[i] = gpu_in[i].detach().requires_grad_(True)
    want = nostall.ppo_loss(*cpu_in)
    want.loss.backward()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = nostall.ppo_loss(*gpu_in)
        got.loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu_in[0].grad.cpu(), cpu_in[0].grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu_in[2].grad.cpu(), cpu_in[2].grad, rtol=1e-5, atol=1e-6)


# ppo_loss_from_log_prob: the same loss from any distribution's log-probabilities -------------


def log_prob_batch(M, dtype=torch.float64, seed=0, spread=0.5):
    """(log_prob, entropy, value, old_log_prob, old_value, advantage, value_target) of a
    diagonal Gaussian policy, its log-probabilities and entropies written out."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(M, 2, generator=g, dtype=dtype)
    log_std = 0.3 * torch.randn(2, generator=g, dtype=dtype)
    action = mean + log_std.exp() * torch.randn(M, 2, generator=g, dtype=dtype)
    dist = torch.distributions.Normal(mean, log_std.exp(), validate_args=False)
    log_prob = dist.log_prob(action).sum(-1)
    entropy = dist.entropy().sum(-1)
    _, _, value, _, old_value, advantage, value_target = minibatch(M, 2, dtype, seed, spread)
    old_log_prob = log_prob + spread * torch.randn(M, generator=g, dtype=dtype)
    return log_prob, entropy, value, old_log_prob, old_value, advantage, value_target


def _diff3(batch):
    lp, h, v, *rest = batch
    return tuple(t.clone().requires_grad_(True) for t in (lp, h, v)) + tuple(rest)


def _check_log_prob_variant(batch, options, dtype):
    ours_in, ref_in = _diff3(batch), _diff3(batch)
    ours = nostall.ppo_loss_from_log_prob(*ours_in, **options)
    want = reference.ppo_loss_from_log_prob(*ref_in, **options)
    for got, expected in zip(ours[:6], want, strict=True):
        torch.testing.assert_close(got, expected, **TOL[dtype])
    ours.loss.backward()
    want[0].backward()
    for i in (0, 1, 2):  # log_prob, entropy, value
        torch.testing.assert_close(ours_in[i].grad, ref_in[i].grad, **TOL[dtype])


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_prob_variant_matches_the_op_by_op_loss(options, dtype):
    _check_log_prob_variant(log_prob_batch(256, dtype, seed=6), options, dtype)


@settings(max_examples=30, deadline=None)
@given(
    M=st.integers(2, 70),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
    spread=st.floats(0.0, 2.0),
    options=st.sampled_from(OPTIONS),
)
def test_log_prob_variant_on_any_minibatch(M, dtype, seed, spread, options):
    _check_log_prob_variant(log_prob_batch(M, dtype, seed, spread), options, dtype)


def test_log_prob_variant_agrees_with_the_categorical_op():
    logits, action, *rest = minibatch(64, 3, seed=7)
    log_p = logits.log_softmax(-1)
    log_prob = log_p.gather(-1, action[:, None]).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    via_logits = nostall.ppo_loss(logits, action, *rest)
    via_log_prob = nostall.ppo_loss_from_log_prob(log_prob, entropy, *rest)
    torch.testing.assert_close(via_log_prob.stats, via_logits.stats, **TOL[torch.float64])
    torch.testing.assert_close(via_log_prob.loss, via_logits.loss, **TOL[torch.float64])


def test_log_prob_variant_gradcheck_opcheck_and_compile():
    lp, h, v, *targets = log_prob_batch(12, seed=8, spread=0.3)

    def loss(lp, h, v):
        return nostall.ppo_loss_from_log_prob(lp, h, v, *targets, value_clip=0.3).loss

    inputs = tuple(t.clone().requires_grad_() for t in (lp, h, v))
    assert torch.autograd.gradcheck(loss, inputs)
    args = (*_diff3((lp, h, v, *targets)), 0.2, 0.2, 0.01, 0.5, True)
    torch.library.opcheck(ops.ppo_loss_from_log_prob.default, args)
    grads = ops.ppo_loss_from_log_prob(*args)[2:]
    torch.library.opcheck(
        ops.ppo_loss_from_log_prob_backward.default, (torch.tensor(2.0).double(), *grads, 0.01)
    )
    eager_in, compiled_in = _diff3((lp, h, v, *targets)), _diff3((lp, h, v, *targets))
    want = loss(*eager_in[:3])
    torch._dynamo.reset()
    got = torch.compile(loss, fullgraph=True)(*compiled_in[:3])
    torch.testing.assert_close(got, want)
    want.backward()
    got.backward()
    for a, b in zip(compiled_in[:3], eager_in[:3], strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def _log_prob_bad_cases():
    lp, h, v, olp, ov, adv, tgt = log_prob_batch(4)
    ok = [lp, h, v, olp, ov, adv, tgt, 0.2, 0.2, 0.01, 0.5, True]

    def with_(i, x):
        args = list(ok)
        args[i] = x
        return args

    return [
        (with_(0, lp[:, None]), "log_prob must be \\[M\\], got 2 dimensions"),
        (with_(0, lp.int()), "log_prob must be float32 or float64"),
        (with_(1, h[:3]), "entropy must be \\[M\\] = \\[4\\], one per sample of log_prob"),
        (with_(2, v.float()), "value must have the dtype of log_prob"),
        (with_(6, tgt[:2]), "value_target must be \\[M\\] = \\[4\\]"),
        (with_(7, float("inf")), "clip_coef must be a finite number >= 0"),
    ]


@pytest.mark.parametrize("case", range(len(_log_prob_bad_cases())))
def test_log_prob_variant_bad_arguments_eager_and_fake(case):
    args, message = _log_prob_bad_cases()[case]
    with pytest.raises(RuntimeError, match=message):
        ops.ppo_loss_from_log_prob(*args)
    with pytest.raises(RuntimeError, match=message), torch._subclasses.FakeTensorMode() as mode:
        ops.ppo_loss_from_log_prob(
            *[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        )


def test_log_prob_variant_refuses_targets_with_grad_and_double_backward():
    lp, h, v, olp, ov, adv, tgt = log_prob_batch(5)
    with pytest.raises(RuntimeError, match="old_log_prob must not require grad"):
        nostall.ppo_loss_from_log_prob(lp, h, v, olp.requires_grad_(), ov, adv, tgt)
    lp = lp.requires_grad_()
    out = nostall.ppo_loss_from_log_prob(lp, h, v, olp.detach(), ov, adv, tgt)
    with pytest.raises(RuntimeError, match="ppo_loss_from_log_prob has no second derivative"):
        torch.autograd.grad(out.loss, lp, create_graph=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
@pytest.mark.parametrize("M", [7, 1000])
def test_log_prob_variant_cuda_matches_cpu_without_sync(M):
    batch = log_prob_batch(M, torch.float32, seed=9)
    cpu_in = _diff3(batch)
    gpu_in = [t.cuda() for t in batch]
    gpu_in[:3] = [t.detach().requires_grad_(True) for t in gpu_in[:3]]
    want = nostall.ppo_loss_from_log_prob(*cpu_in)
    want.loss.backward()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = nostall.ppo_loss_from_log_prob(*gpu_in)
        got.loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.testing.assert_close(got.stats.cpu(), want.stats, rtol=1e-5, atol=1e-6)
    for g, c in zip(gpu_in[:3], cpu_in[:3], strict=True):
        torch.testing.assert_close(g.grad.cpu(), c.grad, rtol=1e-5, atol=1e-6)
