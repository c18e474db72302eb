"""The advantage ops as PyTorch custom operators: opcheck, gradients, compile, vmap, no syncs."""

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nostall
from nostall.ops import reference
from tests.ops.rollouts import make_rollout

ops = torch.ops.nostall


def _grad(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def op_cases(device: str):
    ro = make_rollout(6, 3, seed=11).to(device)
    r, v, nv = _grad(ro.reward), _grad(ro.value), _grad(ro.next_value)
    d, term = ro.done, ro.terminated
    return {
        "gae": (ops.gae.default, (r, v, nv, d, term, 0.9, 0.8)),
        "gae_backward": (ops.gae_backward.default, (r, v, d, term, 0.9, 0.8)),
        "discounted_returns": (ops.discounted_returns.default, (r, d, term, nv, 0.9)),
        "discounted_returns_backward": (
            ops.discounted_returns_backward.default,
            (r, d, term, 0.9),
        ),
        "vtrace": (
            ops.vtrace.default,
            (ro.behavior_log_prob, ro.target_log_prob, r, v, nv, d, term, 0.9, 1.0, 0.7),
        ),
    }


@pytest.mark.parametrize(
    "name", ["gae", "gae_backward", "discounted_returns", "discounted_returns_backward", "vtrace"]
)
def test_opcheck(device, name):
    op, args = op_cases(device)[name]
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result


def test_gae_gradcheck_and_gradgradcheck(device):
    ro = make_rollout(9, 4, seed=12).to(device)
    inputs = (_grad(ro.reward), _grad(ro.value), _grad(ro.next_value))

    def f(r, v, nv):
        return nostall.gae(r, v, nv, ro.done, ro.terminated, 0.9, 0.8)

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def test_discounted_returns_gradcheck_and_gradgradcheck(device):
    ro = make_rollout(9, 4, seed=13).to(device)
    inputs = (_grad(ro.reward), _grad(ro.next_value))

    def f(r, b):
        return nostall.discounted_returns(r, ro.done, ro.terminated, b, 0.9)

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def test_gae_gradient_matches_reference_autograd():
    ro = make_rollout(50, 7, seed=14)
    ours = [_grad(x) for x in (ro.reward, ro.value, ro.next_value)]
    theirs = [_grad(x) for x in (ro.reward, ro.value, ro.next_value)]
    w1, w2 = torch.randn(50, 7, dtype=torch.float64), torch.randn(50, 7, dtype=torch.float64)
    a, t = nostall.gae(*ours, ro.done, ro.terminated, 0.9, 0.8)
    ((a * w1).sum() + (t * w2).sum()).backward()
    a, t = reference.gae(*theirs, ro.done, ro.terminated, 0.9, 0.8)
    ((a * w1).sum() + (t * w2).sum()).backward()
    for x, y in zip(ours, theirs, strict=True):
        torch.testing.assert_close(x.grad, y.grad)


def test_vtrace_outputs_are_explicitly_non_differentiable():
    ro = make_rollout(8, 2, seed=15)
    value = _grad(ro.value)
    vs, pg = nostall.vtrace(
        ro.behavior_log_prob,
        _grad(ro.target_log_prob),
        _grad(ro.reward),
        value,
        ro.next_value,
        ro.done,
        ro.terminated,
    )
    assert not vs.requires_grad and not pg.requires_grad
    # Used as a regression target, the gradient flows only through the prediction.
    ((value - vs) ** 2).sum().backward()
    torch.testing.assert_close(value.grad, 2 * (value - vs).detach())


def test_compile_fullgraph_has_no_graph_break(device):
    ro = make_rollout(32, 4, seed=16).to(device)
    torch._dynamo.reset()

    def step(r, v, nv, d, term, blp, tlp):
        adv, target = nostall.gae(r, v, nv, d, term, 0.99, 0.95)
        returns = nostall.discounted_returns(r, d, term, nv, 0.99)
        vs, pg = nostall.vtrace(blp, tlp, r, v, nv, d, term, 0.99, 1.0, 1.0)
        return adv * 2 + target, returns, vs - pg

    args = (ro.reward, ro.value, ro.next_value, ro.done, ro.terminated)
    args += (ro.behavior_log_prob, ro.target_log_prob)
    explanation = torch._dynamo.explain(step)(*args)
    assert explanation.graph_break_count == 0
    compiled = torch.compile(step, fullgraph=True)
    for got, want in zip(compiled(*args), step(*args), strict=True):
        torch.testing.assert_close(got, want)


def test_compiled_backward_matches_eager():
    ro = make_rollout(16, 3, seed=17)
    torch._dynamo.reset()

    def loss(r, v, nv):
        adv, target = nostall.gae(r, v, nv, ro.done, ro.terminated, 0.9, 0.9)
        returns = nostall.discounted_returns(r, ro.done, ro.terminated, nv, 0.9)
        return (adv**2).sum() + (target * returns).sum()

    compiled = torch.compile(loss, fullgraph=True)
    eager_in = [_grad(x) for x in (ro.reward, ro.value, ro.next_value)]
    comp_in = [_grad(x) for x in (ro.reward, ro.value, ro.next_value)]
    loss(*eager_in).backward()
    compiled(*comp_in).backward()
    for a, b in zip(eager_in, comp_in, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


class _OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batch_dim", [0, 1, 2])
def test_vmap_uses_one_native_call_per_op(batch_dim):
    B, T, N = 5, 20, 3
    ros = [make_rollout(T, N, seed=20 + b) for b in range(B)]
    stack = lambda f: torch.stack([getattr(r, f) for r in ros], dim=batch_dim)  # noqa: E731
    fields = ["reward", "value", "next_value", "done", "terminated"]
    batched = [stack(f) for f in fields]
    recorder = _OpRecorder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default (looping) rule warns
        with recorder:
            adv, target = torch.vmap(lambda *a: nostall.gae(*a, 0.9, 0.8), in_dims=batch_dim)(
                *batched
            )
    assert recorder.calls.count("nostall.gae.default") == 1
    for b, ro in enumerate(ros):
        want = nostall.gae(*(getattr(ro, f) for f in fields), 0.9, 0.8)
        torch.testing.assert_close(adv[b], want[0], rtol=0, atol=0)
        torch.testing.assert_close(target[b], want[1], rtol=0, atol=0)


def test_vmap_with_shared_unbatched_arguments():
    B, T, N = 3, 10, 4
    ro = make_rollout(T, N, seed=30)
    rewards = torch.randn(B, T, N, dtype=torch.float64)
    returns = torch.vmap(
        lambda r: nostall.discounted_returns(r, ro.done, ro.terminated, ro.next_value, 0.9)
    )(rewards)
    for b in range(B):
        want = nostall.discounted_returns(rewards[b], ro.done, ro.terminated, ro.next_value, 0.9)
        torch.testing.assert_close(returns[b], want, rtol=0, atol=0)
    blp = torch.randn(B, T, N, dtype=torch.float64)
    vs, pg = torch.vmap(
        lambda b: nostall.vtrace(
            b, ro.target_log_prob, ro.reward, ro.value, ro.next_value, ro.done, ro.terminated
        )
    )(blp)
    want = nostall.vtrace(
        blp[1], ro.target_log_prob, ro.reward, ro.value, ro.next_value, ro.done, ro.terminated
    )
    torch.testing.assert_close(vs[1], want[0], rtol=0, atol=0)
    torch.testing.assert_close(pg[1], want[1], rtol=0, atol=0)


def test_vmap_rejects_a_per_sample_tensor_that_is_not_time_major():
    with pytest.raises(RuntimeError, match="reward must be a time-major"):
        torch.vmap(
            lambda r: nostall.discounted_returns(
                r, torch.zeros(4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool), r, 0.9
            )
        )(torch.randn(2, 4))


def test_ops_dispatch_nothing_that_syncs():
    # Everything below the public function is the one native op: no item(), nonzero(),
    # or copy to the host that would synchronise a CUDA device.
    ro = make_rollout(16, 4, seed=40)
    recorder = _OpRecorder()
    with recorder:
        nostall.gae(ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.9, 0.9)
        nostall.discounted_returns(ro.reward, ro.done, ro.terminated, ro.next_value, 0.9)
        nostall.vtrace(
            ro.behavior_log_prob,
            ro.target_log_prob,
            ro.reward,
            ro.value,
            ro.next_value,
            ro.done,
            ro.terminated,
        )
    assert recorder.calls == [
        "nostall.gae.default",
        "nostall.discounted_returns.default",
        "nostall.vtrace.default",
    ]
