"""Property tests: reference agreement over random shapes and boundary patterns, and no crash
(only a clean RuntimeError or TypeError) on malformed input."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nostall
from nostall.ops import reference

FLOAT_DTYPES = st.sampled_from([torch.float32, torch.float64])
UNIT = st.floats(0.0, 1.0)


@st.composite
def rollouts(draw):
    T = draw(st.integers(1, 40))
    N = draw(st.integers(1, 40))
    dtype = draw(FLOAT_DTYPES)
    seed = draw(st.integers(0, 2**31 - 1))
    p_end = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(T, N, generator=g) < p_end
    terminated = done & (torch.rand(T, N, generator=g) < 0.5)
    tensors = [torch.randn(T, N, generator=g, dtype=dtype) for _ in range(5)]
    return dtype, done, terminated, tensors


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)


@settings(max_examples=150, deadline=None)
@given(rollouts(), UNIT, UNIT)
def test_gae_agrees_with_reference(ro, gamma, lmbda):
    dtype, done, term, (r, v, nv, _, _) = ro
    for got, want in zip(
        nostall.gae(r, v, nv, done, term, gamma, lmbda),
        reference.gae(r, v, nv, done, term, gamma, lmbda),
        strict=True,
    ):
        torch.testing.assert_close(got, want, **_tol(dtype))


@settings(max_examples=150, deadline=None)
@given(rollouts(), UNIT)
def test_discounted_returns_agrees_with_reference(ro, gamma):
    dtype, done, term, (r, _, b, _, _) = ro
    torch.testing.assert_close(
        nostall.discounted_returns(r, done, term, b, gamma),
        reference.discounted_returns(r, done, term, b, gamma),
        **_tol(dtype),
    )


@settings(max_examples=150, deadline=None)
@given(rollouts(), UNIT, st.floats(0.05, 5.0), st.floats(0.05, 5.0))
def test_vtrace_agrees_with_reference(ro, gamma, rho_bar, c_bar):
    dtype, done, term, (r, v, nv, blp, tlp) = ro
    for got, want in zip(
        nostall.vtrace(blp, tlp, r, v, nv, done, term, gamma, rho_bar, c_bar),
        reference.vtrace(blp, tlp, r, v, nv, done, term, gamma, rho_bar, c_bar),
        strict=True,
    ):
        torch.testing.assert_close(got, want, **_tol(dtype))


DTYPES = st.sampled_from(
    [torch.float32, torch.float64, torch.float16, torch.int64, torch.bool, torch.uint8]
)


@st.composite
def malformed_tensors(draw):
    dims = draw(st.lists(st.integers(0, 4), min_size=0, max_size=3))
    dtype = draw(DTYPES)
    return torch.zeros(dims, dtype=dtype)


SCALARS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.just(math.pi)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(malformed_tensors(), min_size=5, max_size=5), SCALARS, SCALARS)
def test_gae_never_crashes_on_malformed_input(tensors, gamma, lmbda):
    try:
        adv, target = nostall.gae(*tensors, gamma, lmbda)
    except RuntimeError as e:
        assert str(e)  # a message, not a crash
    else:
        assert adv.shape == tensors[0].shape == target.shape


@settings(max_examples=300, deadline=None)
@given(st.lists(malformed_tensors(), min_size=7, max_size=7), SCALARS, SCALARS, SCALARS)
def test_vtrace_never_crashes_on_malformed_input(tensors, gamma, rho_bar, c_bar):
    try:
        nostall.vtrace(*tensors, gamma, rho_bar, c_bar)
    except RuntimeError as e:
        assert str(e)


@settings(max_examples=300, deadline=None)
@given(st.lists(malformed_tensors(), min_size=4, max_size=4), SCALARS)
def test_discounted_returns_never_crashes_on_malformed_input(tensors, gamma):
    try:
        nostall.discounted_returns(*tensors, gamma)
    except RuntimeError as e:
        assert str(e)
