"""sample_tokens: tokens and behaviour log-probs against the pure-PyTorch reference (temperature,
top-k, top-p, banned tokens, finished rows), sampled frequencies against the truncated
softmax, opcheck, compile, errors (eager and fake) and a CUDA twin."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nostall  # noqa: F401
from nostall.ops import reference
from nostall.ops.sampling import sample_tokens

ops = torch.ops.nostall


def _inputs(B, V, dtype=torch.float32, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g, dtype=dtype) * scale
    uniform = torch.rand(B, V, generator=g, dtype=dtype)
    finished = torch.rand(B, generator=g) < 0.25
    allowed = torch.ones(V, dtype=torch.bool)
    allowed[: min(2, V - 1)] = False  # two banned specials, as <pad> and <bos>
    return logits, uniform, finished, allowed


def _both(logits, uniform, finished, allowed, **kw):
    kw = (
        dict(temperature=1.0, top_k=0, top_p=1.0, eos_token_id=logits.shape[1] - 1, pad_token_id=0)
        | kw
    )
    mine_finished = finished.clone()
    token, log_prob = ops.sample_tokens(
        logits,
        uniform,
        mine_finished,
        allowed,
        kw["temperature"],
        kw["top_k"],
        kw["top_p"],
        kw["eos_token_id"],
        kw["pad_token_id"],
    )
    ref = reference.sample_tokens(
        logits,
        uniform,
        finished,
        allowed,
        kw["temperature"],
        kw["top_k"],
        kw["top_p"],
        kw["eos_token_id"],
        kw["pad_token_id"],
    )
    return (token, log_prob, mine_finished), ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"temperature": 0.7},
        {"top_k": 3},
        {"top_p": 0.8},
        {"top_k": 5, "top_p": 0.6},
        {"top_k": 1},
        {"temperature": 1.5, "top_p": 0.95},
    ],
)
def test_matches_reference(dtype, kw):
    mine, ref = _both(*_inputs(64, 22, dtype), **kw)
    assert torch.equal(mine[0], ref[0])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mine[1], ref[1], **tol)
    assert torch.equal(mine[2], ref[2])


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 9),
    V=st.integers(3, 300),
    top_k=st.integers(0, 8),
    top_p=st.floats(0.05, 1.0),
    temperature=st.floats(0.3, 3.0),
    seed=st.integers(0, 99),
)
def test_matches_reference_fuzzed(B, V, top_k, top_p, temperature, seed):
    mine, ref = _both(*_inputs(B, V, seed=seed), top_k=top_k, top_p=top_p, temperature=temperature)
    assert torch.equal(mine[0], ref[0])
    torch.testing.assert_close(mine[1], ref[1], rtol=1e-5, atol=1e-5)


def test_banned_tokens_are_never_sampled_and_eos_finishes():
    logits = torch.zeros(4096, 5)
    logits[:, 0] = 10.0  # the banned token is by far the likeliest
    allowed = torch.tensor([False, True, True, True, True])
    finished = torch.zeros(4096, dtype=torch.bool)
    token, _ = sample_tokens(
        logits,
        finished,
        allowed,
        eos_token_id=4,
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
    )
    assert (token != 0).all()
    assert torch.equal(finished, token == 4)
    # The next step: finished rows emit padding with log-prob 0 and stay finished.
    again, log_prob = sample_tokens(
        logits,
        finished,
        allowed,
        eos_token_id=4,
        pad_token_id=0,
        generator=torch.Generator().manual_seed(1),
    )
    assert (again[token == 4] == 0).all() and (log_prob[token == 4] == 0).all()


def test_nothing_to_sample_is_visible():
    logits = torch.tensor([[float("nan")] * 4, [1.0, 2.0, 3.0, 4.0]])
    finished = torch.zeros(2, dtype=torch.bool)
    token, log_prob = sample_tokens(
        logits,
        finished,
        torch.ones(4, dtype=torch.bool),
        eos_token_id=3,
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
    )
    assert token[0] == 0 and torch.isnan(log_prob[0])
    assert torch.isfinite(log_prob[1])


@pytest.mark.parametrize("kw", [{}, {"top_k": 3}, {"top_p": 0.7}, {"temperature": 0.5}])
def test_frequencies_follow_the_truncated_softmax(kw):
    """Each token's frequency over n draws lies within 5 standard errors of its probability
    under the truncated distribution (fixed seed: deterministic, and fails for a wrong one)."""
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.0])
    allowed = torch.ones(6, dtype=torch.bool)
    allowed[5] = False
    n = 40000
    finished = torch.zeros(n, dtype=torch.bool)
    token, log_prob = sample_tokens(
        logits.expand(n, 6).contiguous(),
        finished,
        allowed,
        eos_token_id=4,
        pad_token_id=5,
        generator=torch.Generator().manual_seed(0),
        **kw,
    )
    x = (logits / kw.get("temperature", 1.0)).masked_fill(~allowed, float("-inf"))
    p = reference_probabilities(x, kw.get("top_k", 0), kw.get("top_p", 1.0))
    freq = torch.bincount(token, minlength=6).double() / n
    se = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1e-12).all(), (freq, p)
    # And every returned log-prob is its token's under the policy before truncation (what the
    # trainer computes from the same logits), whatever top-k or top-p kept.
    policy = x.log_softmax(-1)
    torch.testing.assert_close(log_prob, policy[token].float(), rtol=1e-5, atol=1e-5)


def reference_probabilities(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    x = x.double()
    if top_k:
        x = x.masked_fill(x < x.topk(top_k).values[-1], float("-inf"))
    if top_p < 1:
        order = x.argsort(descending=True)
        p = x.softmax(-1)[order]
        keep_n = int((p.cumsum(-1) >= top_p).double().argmax()) + 1
        x = x.masked_fill(x < x[order[keep_n - 1]], float("-inf"))
    return x.softmax(-1)


def test_opcheck():
    logits, uniform, finished, allowed = _inputs(8, 22)
    torch.library.opcheck(
        ops.sample_tokens.default,
        (logits, uniform, finished.clone(), allowed, 0.9, 4, 0.9, 21, 0),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


def test_compiles_without_graph_breaks():
    logits, uniform, finished, allowed = _inputs(8, 22)

    def step(logits, uniform, finished):
        token, log_prob = ops.sample_tokens(
            logits * 2, uniform, finished, allowed, 1.0, 0, 1.0, 21, 0
        )
        return token + 1, log_prob

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    f1, f2 = finished.clone(), finished.clone()
    out, ref = compiled(logits, uniform, f1), step(logits, uniform, f2)
    assert torch.equal(out[0], ref[0]) and torch.equal(f1, f2)


ERRORS = [
    (lambda a: dict(a, logits=a["logits"][0]), "logits must be \\[B, V\\]"),
    (lambda a: dict(a, logits=a["logits"].int()), "logits must be float32 or float64"),
    (lambda a: dict(a, uniform=a["uniform"][:, :3]), "uniform must have the shape of logits"),
    (lambda a: dict(a, uniform=a["uniform"].double()), "uniform must have the dtype"),
    (lambda a: dict(a, finished=a["finished"].int()), "finished must be bool"),
    (lambda a: dict(a, finished=a["finished"][:2]), "finished must be \\[B\\]"),
    (lambda a: dict(a, allowed=a["allowed"][:3]), "allowed must be \\[V\\]"),
    (lambda a: dict(a, temperature=0.0), "temperature must be a positive finite"),
    (lambda a: dict(a, temperature=float("nan")), "temperature must be a positive finite"),
    (lambda a: dict(a, top_k=-1), "top_k must be >= 0"),
    (lambda a: dict(a, top_p=0.0), "top_p must lie in"),
    (lambda a: dict(a, top_p=1.5), "top_p must lie in"),
    (lambda a: dict(a, eos=22), "eos_token_id must lie in"),
    (lambda a: dict(a, pad=-1), "pad_token_id must lie in"),
]


@pytest.mark.parametrize("mode", ["eager", "fake"])
@pytest.mark.parametrize("edit,message", ERRORS)
def test_bad_input_is_named(mode, edit, message):
    logits, uniform, finished, allowed = _inputs(4, 22)
    a = edit(
        dict(
            logits=logits,
            uniform=uniform,
            finished=finished,
            allowed=allowed,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos=21,
            pad=0,
        )
    )
    args = (
        a["logits"],
        a["uniform"],
        a["finished"],
        a["allowed"],
        a["temperature"],
        a["top_k"],
        a["top_p"],
        a["eos"],
        a["pad"],
    )
    if mode == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as fake:
            args = tuple(fake.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args)
            with pytest.raises(RuntimeError, match=message):
                ops.sample_tokens(*args)
    else:
        with pytest.raises(RuntimeError, match=message):
            ops.sample_tokens(*args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
@pytest.mark.parametrize("kw", [{}, {"top_k": 3}, {"top_p": 0.8}, {"top_k": 40, "top_p": 0.9}])
@pytest.mark.parametrize("V", [22, 5000])
def test_cuda_matches_cpu(kw, V):
    logits, uniform, finished, allowed = _inputs(32, V)
    cpu = _both(logits, uniform, finished, allowed, **kw)[0]
    cuda = _both(logits.cuda(), uniform.cuda(), finished.cuda(), allowed.cuda(), **kw)[0]
    assert torch.equal(cuda[0].cpu(), cpu[0]) and torch.equal(cuda[2].cpu(), cpu[2])
    torch.testing.assert_close(cuda[1].cpu(), cpu[1], rtol=1e-5, atol=1e-5)
