"""nostall.token_entropy_linear (an entropy bonus's input) against the entropy of
torch.distributions.Categorical over the full logits (nostall.ops.reference), values and
gradients; its limits (one token, a uniform and a near-deterministic distribution, NaN); under
torch.compile; and bad input named, eager and compiled.

Tolerances: float64 to 1e-12 (summation order only); float32 to 1e-5 (a few ulp of sums over
V); bfloat16 judged against a float32 computation, as token_log_prob_linear's tests judge it.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nostall
from nostall.ops import reference

ops = torch.ops.nostall
F64 = dict(rtol=1e-12, atol=1e-12)
F32 = dict(rtol=1e-5, atol=1e-5)


def _inputs(B, T, H, V, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(B, T, H, generator=g, dtype=torch.float64) * scale).to(dtype)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype)
    return hidden, weight


def _max_error(x, ref):
    return (x.double() - ref.double()).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [1, 5, 7, 1000])
@pytest.mark.parametrize("V", [1, 7, 19, 50])
def test_matches_reference_values_and_gradients(dtype, chunk_size, V):
    hidden, weight = _inputs(3, 5, 16, V, dtype, seed=chunk_size + V)
    w = torch.randn(3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ours = nostall.token_entropy_linear(h1, w1, chunk_size)
    want = reference.token_entropy_linear(h2, w2)
    assert ours.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    (ours * w.to(ours.dtype)).sum().backward()
    (want * w.to(want.dtype)).sum().backward()
    if dtype == torch.bfloat16:
        # The logits are bf16 products in both; compare against float32 math.
        exact = reference.token_entropy_linear(hidden.float(), weight.float())
        assert _max_error(ours, exact) <= 2 * _max_error(want, exact) + 1e-5
        assert h1.grad.dtype == torch.bfloat16 and w1.grad.dtype == torch.bfloat16
        return
    tol = F64 if dtype == torch.float64 else F32
    torch.testing.assert_close(ours, want, **tol)
    torch.testing.assert_close(h1.grad, h2.grad, **tol)
    torch.testing.assert_close(w1.grad, w2.grad, **tol)


def test_gradcheck():
    hidden, weight = _inputs(2, 3, 4, 9, torch.float64, seed=9)
    assert torch.autograd.gradcheck(
        lambda h, w: nostall.token_entropy_linear(h, w, 4),
        (hidden.requires_grad_(), weight.requires_grad_()),
    )


def test_limits_one_token_uniform_and_near_deterministic():
    hidden, weight = _inputs(2, 3, 8, 1, torch.float32, seed=1)
    assert torch.equal(nostall.token_entropy_linear(hidden, weight), torch.zeros(2, 3))
    # A zero weight: every logit 0, the uniform distribution, entropy log V.
    hidden, _ = _inputs(2, 3, 8, 37, torch.float32, seed=2)
    uniform = nostall.token_entropy_linear(hidden, torch.zeros(37, 8))
    torch.testing.assert_close(uniform, torch.full((2, 3), math.log(37)), rtol=1e-6, atol=1e-6)
    # Logits hundreds apart: p log p underflows to exactly 0 for all but the top token, and
    # the entropy is 0 or a tiny positive number, never NaN or negative.
    hidden, weight = _inputs(2, 3, 8, 40, torch.float32, seed=3, scale=300.0)
    x = hidden.clone().requires_grad_()
    peaked = nostall.token_entropy_linear(x, weight)
    assert torch.isfinite(peaked).all() and (peaked >= 0).all() and peaked.max() < 1e-3
    peaked.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_nan_hidden_gives_nan_for_that_row_only():
    hidden, weight = _inputs(2, 2, 8, 20, torch.float32, seed=5)
    hidden[1, 0, 3] = float("nan")
    entropy = nostall.token_entropy_linear(hidden, weight)
    assert entropy[1, 0].isnan()
    assert not entropy[0].isnan().any() and not entropy[1, 1].isnan()


def test_opcheck_forward_and_backward():
    hidden, weight = _inputs(2, 3, 5, 17, torch.float64, seed=3)
    entropy, lse = ops.token_entropy_linear(hidden, weight, 4)
    torch.library.opcheck(
        ops.token_entropy_linear,
        (hidden.clone().requires_grad_(), weight.clone().requires_grad_(), 4),
    )
    torch.library.opcheck(
        ops.token_entropy_linear_backward,
        (torch.randn_like(entropy), hidden, weight, entropy, lse, 4),
    )


def test_compiled_with_no_graph_break_matches_eager():
    hidden, weight = _inputs(3, 4, 8, 11, torch.float32, seed=4)

    def bonus(h, w):
        return -0.01 * nostall.token_entropy_linear(h, w, chunk_size=5).mean()

    torch._dynamo.reset()
    compiled = torch.compile(bonus, fullgraph=True)
    grads = []
    for fn in (bonus, compiled):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        fn(h, w).backward()
        grads.append((h.grad, w.grad))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=1e-7)


def test_statistics_output_is_not_differentiable_and_second_derivative_is_refused():
    hidden, weight = _inputs(2, 3, 4, 9, torch.float64, seed=6)
    h = hidden.requires_grad_()
    entropy, lse = ops.token_entropy_linear(h, weight, 4)
    assert entropy.requires_grad and not lse.requires_grad
    with pytest.raises(RuntimeError, match="token_entropy_linear has no second derivative"):
        torch.autograd.grad(nostall.token_entropy_linear(h, weight).sum(), h, create_graph=True)
    torch.autograd.grad(nostall.token_entropy_linear(h, weight).sum(), h)  # the first: fine


def _run(fn, compiled, *args):
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True, dynamic=False)
    return fn(*args)


BAD_FORWARD = [
    ("hidden_2d", dict(hidden=torch.zeros(6, 4)), "hidden must be \\[B, T, H\\]"),
    ("hidden_half", dict(hidden=torch.zeros(2, 3, 4, dtype=torch.float16)), "hidden must be float"),
    ("weight_h", dict(weight=torch.zeros(10, 5)), "weight must be \\[V, H\\] with H = 4"),
    ("weight_empty", dict(weight=torch.zeros(0, 4)), "weight must have a vocabulary"),
    (
        "weight_dtype",
        dict(weight=torch.zeros(10, 4, dtype=torch.float64)),
        "weight must have the dtype of hidden",
    ),
    ("chunk_zero", dict(chunk_size=0), "chunk_size must be >= 1, got 0"),
]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case,override,message", BAD_FORWARD, ids=[c[0] for c in BAD_FORWARD])
def test_bad_input_is_named(case, override, message, compiled):
    hidden, weight = _inputs(2, 3, 4, 10, torch.float32, seed=7)
    args = dict(hidden=hidden, weight=weight, chunk_size=2)
    args.update(override)
    with pytest.raises(RuntimeError, match=message):
        _run(ops.token_entropy_linear, compiled, args["hidden"], args["weight"], args["chunk_size"])


@pytest.mark.parametrize(
    "name,bad,message",
    [
        ("grad_entropy", torch.zeros(2, 4), "grad_entropy must be \\[B, T\\] = \\[2, 3\\]"),
        ("entropy", torch.zeros(2, 3, dtype=torch.float64), "entropy must be Float, got Double"),
        ("logsumexp", torch.zeros(3, 3), "logsumexp must be \\[B, T\\]"),
    ],
)
def test_backward_names_its_bad_argument(name, bad, message):
    hidden, weight = _inputs(2, 3, 4, 10, torch.float32, seed=8)
    entropy, lse = ops.token_entropy_linear(hidden, weight, 2)
    args = dict(grad_entropy=torch.ones(2, 3), entropy=entropy, logsumexp=lse)
    args[name] = bad
    with pytest.raises(RuntimeError, match=message):
        ops.token_entropy_linear_backward(
            args["grad_entropy"], hidden, weight, args["entropy"], args["logsumexp"], 2
        )


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 6),
    st.integers(1, 9),
    st.integers(1, 70),
    st.integers(1, 40),
    st.sampled_from([0.1, 1.0, 10.0]),
    st.integers(0, 2**31 - 1),
)
def test_agrees_with_reference_and_lies_in_zero_to_log_v(B, T, H, V, chunk, scale, seed):
    hidden, weight = _inputs(B, T, H, V, torch.float64, seed, scale)
    entropy = nostall.token_entropy_linear(hidden, weight, chunk)
    torch.testing.assert_close(entropy, reference.token_entropy_linear(hidden, weight), **F64)
    assert (entropy >= -1e-12).all() and (entropy <= math.log(V) + 1e-12).all()
