"""Property tests of the loss ops: invariances from their definitions, reference agreement over
random shapes and options, and malformed input refused with an error naming an argument the
ops' documented contract (written out here, independently of their checks) refuses."""

import functools
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nostall
from nostall.ops import reference

SEEDS = st.integers(0, 2**31 - 1)


@st.composite
def grouped(draw):
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=12))
    num_groups = len(sizes) + draw(st.integers(0, 2))  # possibly empty groups at the end
    g = torch.Generator().manual_seed(draw(SEEDS))
    index = torch.cat([torch.full((n,), i, dtype=torch.int64) for i, n in enumerate(sizes)])
    index = index[torch.randperm(len(index), generator=g)]
    reward = torch.randn(len(index), generator=g, dtype=torch.float64) * draw(
        st.sampled_from([0.01, 1.0, 100.0])
    )
    if draw(st.booleans()):
        reward = reward.round()  # ties, constant groups
    return reward, index, num_groups


@settings(max_examples=150, deadline=None)
@given(grouped(), st.sampled_from(["group", "batch", "none"]), st.sampled_from([0.0, 1e-4, 1.0]))
def test_group_advantages_properties(data, scale, eps):
    reward, index, num_groups = data
    adv = nostall.group_advantages(reward, index, num_groups, scale, eps)
    assert not adv.isnan().any()
    torch.testing.assert_close(
        adv, reference.group_advantages(reward, index, num_groups, scale, eps), rtol=1e-9, atol=1e-9
    )
    # Each group's advantages sum to zero (before scaling, and scaling is per group or global).
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add(0, index, adv)
    assert sums.abs().max() < 1e-9 * max(1.0, adv.abs().max().item())
    # Adding a constant to a group's rewards changes nothing there (for group scaling).
    if scale != "batch":
        shifted = reward + 3.0 * (index == 0)
        torch.testing.assert_close(
            nostall.group_advantages(shifted, index, num_groups, scale, eps),
            adv,
            rtol=1e-7,
            atol=1e-7,
        )


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 6),
    st.integers(1, 70),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    SEEDS,
)
def test_token_log_prob_properties(B, T, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g) * 4).to(dtype)
    tokens = torch.randint(0, V, (B, T), generator=g)
    lp = nostall.token_log_prob(logits, tokens)
    assert (lp <= 1e-6).all()
    torch.testing.assert_close(lp, reference.token_log_prob(logits, tokens), rtol=1e-5, atol=1e-5)
    # The probabilities of all V tokens sum to one.
    every = torch.arange(V).repeat(B * T).view(B * T, V)
    rows = logits.reshape(B * T, 1, V).expand(B * T, V, V).reshape(1, B * T * V, V)
    all_lp = nostall.token_log_prob(rows, every.reshape(1, -1)).view(B * T, V)
    torch.testing.assert_close(
        all_lp.double().exp().sum(-1), torch.ones(B * T, dtype=torch.float64), rtol=1e-5, atol=1e-5
    )
    # Shifting a row's logits by a constant changes nothing.
    if dtype != torch.bfloat16:
        torch.testing.assert_close(nostall.token_log_prob(logits + 7.0, tokens), lp)


@st.composite
def token_batches(draw):
    B, T = draw(st.integers(1, 6)), draw(st.integers(1, 12))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(SEEDS))
    lp = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    old = lp + draw(st.sampled_from([0.0, 0.1, 1.0])) * torch.randn(B, T, generator=g, dtype=dtype)
    beh = old + 0.3 * torch.randn(B, T, generator=g, dtype=dtype)
    adv_shape = (B, T) if draw(st.booleans()) else (B,)
    adv = torch.randn(*adv_shape, generator=g, dtype=dtype)
    mask = torch.rand(B, T, generator=g) < draw(st.sampled_from([0.0, 0.5, 1.0]))
    return lp, old, beh, adv, mask


@settings(max_examples=150, deadline=None)
@given(
    token_batches(),
    st.sampled_from(["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]),
    st.floats(0.0, 0.5),
    st.floats(0.0, 0.5),
    st.one_of(st.none(), st.floats(1.01, 10.0)),
    st.booleans(),
    st.integers(1, 20),
)
def test_policy_loss_agrees_with_reference(batch, aggregation, lo, hi, dual, use_beh, max_tokens):
    lp, old, beh, adv, mask = batch
    beh = beh if use_beh else None
    kwargs = dict(dual_clip=dual, behavior_log_prob=beh)
    got = nostall.clipped_policy_loss(lp, old, adv, mask, lo, hi, aggregation, max_tokens, **kwargs)
    want = reference.clipped_policy_loss(
        lp, old, adv, mask, lo, hi, aggregation, max_tokens, dual, beh, 2.0
    )
    tol = dict(rtol=1e-5, atol=1e-6) if lp.dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **tol)
    assert 0 <= got.clip_fraction <= 1 and got.approx_kl >= -1e-6


@settings(max_examples=50, deadline=None)
@given(token_batches())
def test_on_policy_loss_is_minus_the_mean_advantage(batch):
    # ratio = 1 everywhere: nothing clipped, KL 0, loss = -token mean of A.
    lp, _, _, adv, mask = batch
    out = nostall.clipped_policy_loss(lp, lp, adv, mask)
    a = adv if adv.dim() == 2 else adv.unsqueeze(1).expand_as(lp)
    want = -(a * mask).sum() / mask.sum().clamp(min=1)
    torch.testing.assert_close(out.loss, want.to(lp.dtype))
    assert out.clip_fraction == 0 and out.approx_kl == 0


ANY_TENSOR = st.one_of(
    st.builds(
        lambda shape, dtype: torch.zeros(shape, dtype=dtype),
        st.lists(st.integers(0, 3), max_size=4).map(tuple),
        st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool]),
    ),
    st.none(),
)
FLOATS = (torch.float32, torch.float64)
LOGITS = (*FLOATS, torch.bfloat16)


def _bad(t, dims: int, dtypes: tuple, shape: tuple | None = None) -> bool:
    """Whether `t` is not a tensor of `dims` dimensions, one of `dtypes`, of `shape` (None:
    any; a None entry: any size there)."""
    if t is None or t.dim() != dims or t.dtype not in dtypes:
        return True
    sizes = zip(shape or (), t.shape, strict=False)  # (no shape: nothing to compare)
    return any(w is not None and w != n for w, n in sizes)


def _group_advantages_contract(reward, group_index, num_groups, scale) -> set[str]:
    bad = set()
    if _bad(reward, 1, FLOATS) or reward.shape[0] < 1:
        bad.add("reward")
    n = None if reward is None or reward.dim() != 1 else reward.shape[0]
    if _bad(group_index, 1, (torch.int64,), (n,)):
        bad.add("group_index")
    if num_groups < 1:
        bad.add("num_groups")
    if scale not in ("group", "batch", "none"):
        bad.add("scale")
    return bad  # (every index is 0: in range whenever num_groups >= 1)


def _token_log_prob_contract(logits, tokens) -> set[str]:
    bad = set()
    if _bad(logits, 3, LOGITS) or logits.shape[2] < 1:
        bad.add("logits")
    rows = (None, None) if logits is None or logits.dim() != 3 else tuple(logits.shape[:2])
    if _bad(tokens, 2, (torch.int64,), rows):
        bad.add("tokens")
    return bad


def _token_log_prob_linear_contract(hidden, weight, tokens, chunk_size) -> set[str]:
    bad = set()
    if _bad(hidden, 3, LOGITS):
        bad.add("hidden")
    width = None if hidden is None or hidden.dim() != 3 else hidden.shape[2]
    dtypes = LOGITS if "hidden" in bad else (hidden.dtype,)
    if _bad(weight, 2, dtypes, (None, width)) or weight.shape[0] < 1:
        bad.add("weight")
    rows = (None, None) if "hidden" in bad else tuple(hidden.shape[:2])
    if _bad(tokens, 2, (torch.int64,), rows):
        bad.add("tokens")
    if chunk_size is not None and chunk_size < 1:
        bad.add("chunk_size")
    return bad


def _policy_loss_contract(
    log_prob, old_log_prob, advantage, mask, aggregation, max_tokens
) -> set[str]:
    bad = set()
    if _bad(log_prob, 2, FLOATS) or min(log_prob.shape) < 1:
        bad.add("log_prob")
    B, T = (None, None) if log_prob is None or log_prob.dim() != 2 else log_prob.shape
    dtypes = FLOATS if "log_prob" in bad else (log_prob.dtype,)
    if _bad(old_log_prob, 2, dtypes, (B, T)):
        bad.add("old_log_prob")
    if advantage is None or advantage.dim() not in (1, 2):
        bad.add("advantage")
    elif _bad(advantage, advantage.dim(), dtypes, (B, T)[: advantage.dim()]):
        bad.add("advantage")
    if _bad(mask, 2, (torch.bool,), (B, T)):
        bad.add("mask")
    if aggregation not in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        bad.add("aggregation")
    if max_tokens is not None and max_tokens < 1:
        bad.add("max_tokens")
    return bad


def _expect(call, bad: set[str]) -> None:
    """`call()` succeeds when the contract finds nothing wrong; otherwise it raises a
    RuntimeError or TypeError (torch's own, for a None tensor) naming an argument that is."""
    if not bad:
        call()
        return
    with pytest.raises((RuntimeError, TypeError)) as raised:
        call()
    named = [name for name in bad if re.search(rf"\b{name}\b", str(raised.value))]
    assert named, f"expected an error naming one of {sorted(bad)}, got: {raised.value}"


def _well_formed(B: int, T: int, V: int, dtype: torch.dtype) -> dict[str, dict]:
    """Each op's arguments, every one as its contract wants."""
    z = functools.partial(torch.zeros, dtype=dtype)
    tokens = torch.zeros(B, T, dtype=torch.int64)
    mask = torch.ones(B, T, dtype=torch.bool)
    return {
        "group_advantages": dict(reward=z(B), group_index=torch.zeros(B, dtype=torch.int64)),
        "token_log_prob": dict(logits=z(B, T, V), tokens=tokens),
        "token_log_prob_linear": dict(hidden=z(B, T, 2), weight=z(V, 2), tokens=tokens),
        "clipped_policy_loss": dict(
            log_prob=z(B, T), old_log_prob=z(B, T), advantage=z(B), mask=mask
        ),
    }


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 3),
    st.sampled_from(FLOATS),
    st.integers(0, 3),
    ANY_TENSOR,
    st.integers(-2, 3),
    st.text(max_size=8),
)
def test_malformed_input_is_refused_naming_the_argument(B, T, V, dtype, which, other, n, word):
    """Every op's well-formed arguments with one of them (`which`, if any) replaced by any
    tensor or None, and any integer and word for its sizes and options: the call succeeds
    exactly when the contract finds nothing wrong, else names what is."""
    ops = _well_formed(B, T, V, dtype)
    for args in ops.values():
        names = list(args)
        if which < len(names):
            args[names[which]] = other
    scale, aggregation = word or "group", word or "token_mean"
    chunk_size, max_tokens = (n if n != 0 else None), (n or None)
    a = ops["group_advantages"]
    _expect(
        lambda: nostall.group_advantages(*a.values(), n, scale),
        _group_advantages_contract(*a.values(), n, scale),
    )
    a = ops["token_log_prob"]
    _expect(lambda: nostall.token_log_prob(*a.values()), _token_log_prob_contract(*a.values()))
    a = ops["token_log_prob_linear"]
    _expect(
        lambda: nostall.token_log_prob_linear(*a.values(), chunk_size),
        _token_log_prob_linear_contract(*a.values(), chunk_size),
    )
    a = ops["clipped_policy_loss"]
    _expect(
        lambda: nostall.clipped_policy_loss(*a.values(), 0.2, 0.2, aggregation, max_tokens),
        _policy_loss_contract(*a.values(), aggregation, max_tokens),
    )
