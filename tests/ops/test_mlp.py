"""nostall.mlp: agreement with nn.functional (forward and gradients, both activations, every
path: the direct small-layer kernel and BLAS), gradcheck, opcheck, compile with no graph break,
clear errors (eager and compiled), and hypothesis-drawn shapes."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import nostall
from nostall.ops import reference
from nostall.ops.networks import sequential_layers

ops = torch.ops.nostall


def make_net(widths, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    weights, biases = [], []
    for k, j in itertools.pairwise(widths):
        weights.append((torch.randn(j, k, generator=g, dtype=dtype) / k**0.5).to(device))
        biases.append(torch.randn(j, generator=g, dtype=dtype).to(device))
    return weights, biases


def leaves(tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


# float32: the direct kernel sums in another order than BLAS, and tanh is within 2 ulp of tanhf.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize(
    "rows, widths",
    [(8, [4, 64, 64, 2]), (256, [4, 64, 64, 1]), (3, [5, 7]), (513, [33, 130, 3]), (1, [1, 1, 1])],
)
def test_matches_reference_values_and_gradients(dtype, activation, rows, widths):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, widths[0], generator=g, dtype=dtype)
    weights, biases = make_net(widths, dtype)
    w1, b1, x1 = leaves(weights), leaves(biases), x.clone().requires_grad_(True)
    w2, b2, x2 = leaves(weights), leaves(biases), x.clone().requires_grad_(True)
    out = nostall.mlp(x1, w1, b1, activation)
    ref = reference.mlp(x2, w2, b2, activation)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    upstream = torch.randn(ref.shape, generator=g, dtype=dtype)
    (out * upstream).sum().backward()
    (ref * upstream).sum().backward()
    for a, b in zip([x1, *w1, *b1], [x2, *w2, *b2], strict=True):
        torch.testing.assert_close(a.grad, b.grad, **TOL[dtype])


def test_tanh_within_two_ulp_of_torch():
    x = torch.linspace(-30, 30, 200_001)
    one = torch.ones(1, 1)
    zero = torch.zeros(1)
    _, (h,) = ops.mlp(x[:, None], [one, one], [zero, zero], "tanh")
    expected = torch.tanh(x)
    ulp = torch.finfo(torch.float32).eps * expected.abs().clamp(min=torch.finfo(torch.float32).tiny)
    assert ((h[:, 0] - expected).abs() <= 2 * ulp + 1e-45).all()
    special = torch.tensor([[0.0], [-0.0], [float("inf")], [-float("inf")], [float("nan")]])
    _, (h,) = ops.mlp(special, [one, one], [zero, zero], "tanh")
    assert h[:4, 0].tolist() == [0.0, -0.0, 1.0, -1.0] and h[4, 0].isnan()


def test_strided_operands_match_contiguous():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 10, generator=g)[:, ::2]  # non-unit column stride
    weights, biases = make_net([5, 12, 3])
    weights[0] = weights[0].t().contiguous().t()  # column-major weight
    torch.testing.assert_close(
        nostall.mlp(x, weights, biases), reference.mlp(x, weights, biases), **TOL[torch.float32]
    )


@pytest.mark.parametrize("rows", [8, 256])  # the direct kernel and the BLAS path
def test_operands_at_a_storage_offset(rows):
    # Weights, biases and input living inside one flat buffer (as an optimizer with flat
    # parameters keeps them): views at nonzero storage offsets.
    g = torch.Generator().manual_seed(3)
    shapes = [(64, 4), (64,), (64, 64), (64,), (2, 64), (2,), (rows, 4)]
    flat = torch.randn(7 + sum(torch.Size(s).numel() for s in shapes), generator=g)
    views, offset = [], 7
    for shape in shapes:
        n = torch.Size(shape).numel()
        views.append(flat[offset : offset + n].view(shape).requires_grad_())
        offset += n
    weights, biases, x = views[0:6:2], views[1:6:2], views[6]
    copies = [v.detach().clone().requires_grad_() for v in views]
    ours = nostall.mlp(x, weights, biases)
    want = reference.mlp(copies[6], copies[0:6:2], copies[1:6:2])
    torch.testing.assert_close(ours, want, **TOL[torch.float32])
    ours.square().sum().backward()
    want.square().sum().backward()
    for v, c in zip(views, copies, strict=True):
        torch.testing.assert_close(v.grad, c.grad, rtol=1e-4, atol=1e-4)


def test_leading_dimensions_and_empty_batch():
    weights, biases = make_net([4, 8, 2])
    x = torch.randn(3, 5, 4)
    torch.testing.assert_close(
        nostall.mlp(x, weights, biases), reference.mlp(x, weights, biases), **TOL[torch.float32]
    )
    assert nostall.mlp(torch.zeros(0, 4), weights, biases).shape == (0, 2)


def test_input_gradient_only_when_asked():
    weights, biases = make_net([3, 4, 2], torch.float64)
    w = leaves(weights)
    x = torch.randn(5, 3, dtype=torch.float64)
    nostall.mlp(x, w, biases).sum().backward()
    assert x.grad is None and all(t.grad is not None for t in w)
    grads = ops.mlp_backward(
        torch.ones(5, 2, dtype=torch.float64),
        x,
        weights,
        ops.mlp(x, weights, biases, "tanh")[1],
        "tanh",
        False,
    )
    assert grads[0] is None


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_gradcheck(activation):
    weights, biases = make_net([3, 4, 5, 2], torch.float64, seed=3)
    x = torch.randn(6, 3, dtype=torch.float64) + 0.1  # relu: keep pre-activations off 0

    def f(x, *params):
        return nostall.mlp(x, params[:3], params[3:], activation)

    assert torch.autograd.gradcheck(f, (x.requires_grad_(), *leaves(weights), *leaves(biases)))


def test_opcheck():
    weights, biases = make_net([3, 4, 2], torch.float64)
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w, b = leaves(weights), leaves(biases)
    torch.library.opcheck(ops.mlp.default, (x, w, b, "tanh"))
    out, hidden = ops.mlp(x.detach(), weights, biases, "relu")
    torch.library.opcheck(
        ops.mlp_backward.default, (torch.ones_like(out), x.detach(), weights, hidden, "relu", True)
    )


def test_no_second_derivative():
    weights, biases = make_net([3, 4, 2], torch.float64)
    w = leaves(weights)
    out = nostall.mlp(torch.randn(5, 3, dtype=torch.float64), w, biases)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(out.sum(), w[0], create_graph=True)


def test_compiles_without_graph_break_forward_and_backward():
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))
    weights, biases, activation = sequential_layers(net)

    def loss(x):
        return nostall.mlp(x, weights, biases, activation).square().mean()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)
    x = torch.randn(32, 4)
    eager_value = loss(x)
    eager_grads = torch.autograd.grad(eager_value, list(net.parameters()))
    value = compiled(x)
    grads = torch.autograd.grad(value, list(net.parameters()))
    torch.testing.assert_close(value, eager_value)
    for a, b in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(eager_value, net(x).square().mean(), **TOL[torch.float32])


def test_sequential_layers():
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    weights, biases, activation = sequential_layers(net)
    assert activation == "relu" and len(weights) == 2 and weights[1] is net[2].weight
    assert biases[0] is net[0].bias
    for bad in (
        nn.Sequential(nn.Linear(2, 3), nn.Tanh()),
        nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1)),
        nn.Sequential(nn.Linear(2, 3, bias=False)),
        nn.Sequential(nn.Linear(2, 3), nn.GELU(), nn.Linear(3, 1)),
    ):
        with pytest.raises(ValueError, match="expected Linear layers"):
            sequential_layers(bad)


def _bad_cases():
    w, b = make_net([4, 8, 2])
    x = torch.randn(5, 4)
    return [
        ((x.double(), w, b, "tanh"), "input must be float32 or float64|weights\\[0\\] and biases"),
        ((x.long(), w, b, "tanh"), "input must be float32 or float64"),
        ((x[0], w, b, "tanh"), "input must be \\[M, K\\]"),
        ((x, [], [], "tanh"), "weights must hold at least one layer"),
        ((x, w, b[:1], "tanh"), "biases must have one tensor per weight"),
        ((x, [w[1], w[0]], b, "tanh"), "weights\\[0\\] must be a \\[J, 4\\] matrix"),
        ((x, [w[0], w[0]], b, "tanh"), "weights\\[1\\] must be a \\[J, 8\\] matrix"),
        ((x, w, [b[1], b[0]], "tanh"), "biases\\[0\\] must be \\[8\\]"),
        (
            (x, [w[0], w[1].double()], b, "tanh"),
            "weights\\[1\\] and biases\\[1\\] must have the dtype",
        ),
        ((x, w, b, "gelu"), "activation must be 'tanh' or 'relu'"),
        (
            (x, [w[0], torch.empty(0, 8)], [b[0], torch.empty(0)], "tanh"),
            "at least one output unit",
        ),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_arguments_raise_clear_errors_eager_and_compiled(case):
    args, message = _bad_cases()[case]
    with pytest.raises(RuntimeError, match=message):
        ops.mlp(*args)
    with pytest.raises(RuntimeError, match=message), torch._subclasses.FakeTensorMode() as mode:
        fake_args = [
            mode.from_tensor(a)
            if isinstance(a, torch.Tensor)
            else [mode.from_tensor(t) for t in a]
            if isinstance(a, list)
            else a
            for a in args
        ]
        ops.mlp(*fake_args)


def test_backward_bad_arguments():
    w, b = make_net([4, 8, 2])
    x = torch.randn(5, 4)
    out, hidden = ops.mlp(x, w, b, "tanh")
    with pytest.raises(RuntimeError, match="hidden must hold 1 activations"):
        ops.mlp_backward(torch.ones_like(out), x, w, [], "tanh", False)
    with pytest.raises(RuntimeError, match="grad_output must be \\[5, 2\\]"):
        ops.mlp_backward(torch.ones(5, 3), x, w, hidden, "tanh", False)
    with pytest.raises(RuntimeError, match="hidden\\[0\\] must be \\[5, 8\\]"):
        ops.mlp_backward(torch.ones_like(out), x, w, [hidden[0][:4]], "tanh", False)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 40),
    widths=st.lists(st.integers(1, 40), min_size=2, max_size=5),
    activation=st.sampled_from(["tanh", "relu"]),
    seed=st.integers(0, 2**16),
)
def test_property_agrees_with_reference(rows, widths, activation, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, widths[0], generator=g, dtype=torch.float64)
    weights, biases = make_net(widths, torch.float64, seed)
    w1, w2 = leaves(weights), leaves(weights)
    out = nostall.mlp(x, w1, biases, activation)
    ref = reference.mlp(x, w2, biases, activation)
    torch.testing.assert_close(out, ref, **TOL[torch.float64])
    out.sum().backward()
    ref.sum().backward()
    for a, b in zip(w1, w2, strict=True):
        torch.testing.assert_close(a.grad, b.grad, **TOL[torch.float64])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_cuda_matches_cpu_without_sync(activation):
    weights, biases = make_net([4, 64, 64, 2])
    x = torch.randn(256, 4)
    x_gpu = x.cuda()
    cw, cb = leaves(weights), leaves(biases)
    gw = [t.detach().cuda().requires_grad_(True) for t in weights]
    gb = [t.detach().cuda().requires_grad_(True) for t in biases]
    a = nostall.mlp(x, cw, cb, activation)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the inputs were made on the default stream
    with torch.cuda.stream(stream):
        torch.cuda.set_sync_debug_mode("error")
        try:
            b = nostall.mlp(x_gpu, gw, gb, activation)
            b.square().sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    stream.synchronize()
    a.square().sum().backward()
    torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-5)
    for p, q in zip([*cw, *cb], [*gw, *gb], strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5)
