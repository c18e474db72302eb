"""Native advantage ops against the pure-PyTorch references and against TorchRL."""

import pytest
import torch
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate,
    vtrace_advantage_estimate,
)

import nostall
from nostall.ops import reference
from tests.ops.rollouts import make_rollout

# float64 kernels and references do the same arithmetic in the same order: agreement to the last
# few ulps. float32 accumulates rounding along T, so relative 1e-5.
TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-5)}
SHAPES = [(1, 1), (7, 3), (128, 8), (300, 65)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T,N", SHAPES)
def test_gae_matches_reference(device, dtype, T, N):
    ro = make_rollout(T, N, dtype, seed=T * N).to(device)
    args = (ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.97, 0.9)
    for got, want in zip(nostall.gae(*args), reference.gae(*args), strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T,N", SHAPES)
def test_discounted_returns_matches_reference(device, dtype, T, N):
    ro = make_rollout(T, N, dtype, seed=T + N).to(device)
    args = (ro.reward, ro.done, ro.terminated, ro.next_value, 0.97)
    torch.testing.assert_close(
        nostall.discounted_returns(*args), reference.discounted_returns(*args), **TOL[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T,N", SHAPES)
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 0.5), (0.3, 5.0)])
def test_vtrace_matches_reference(device, dtype, T, N, rho_bar, c_bar):
    ro = make_rollout(T, N, dtype, seed=T * 31 + N).to(device)
    args = (
        ro.behavior_log_prob,
        ro.target_log_prob,
        ro.reward,
        ro.value,
        ro.next_value,
        ro.done,
        ro.terminated,
        0.97,
        rho_bar,
        c_bar,
    )
    for got, want in zip(nostall.vtrace(*args), reference.vtrace(*args), strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype])


# TorchRL rounds gamma and lambda to float32 inside its loop (it multiplies them by an int
# tensor), so exact agreement in float64 needs values float32 represents exactly.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_equals_torchrl(dtype):
    ro = make_rollout(256, 16, dtype, p_terminated=0.03, p_truncated=0.03, seed=1)
    want_adv, want_target = generalized_advantage_estimate(
        0.984375, 0.9375, ro.value, ro.next_value, ro.reward, ro.done, ro.terminated
    )
    adv, target = nostall.gae(
        ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.984375, 0.9375
    )
    torch.testing.assert_close(adv, want_adv, rtol=0, atol=0)
    torch.testing.assert_close(target, want_target, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vtrace_equals_torchrl(dtype):
    ro = make_rollout(256, 16, dtype, seed=2)
    # TorchRL's `log_pi` is the learner (target) policy and `log_mu` the behaviour policy.
    want_adv, want_vs = vtrace_advantage_estimate(
        0.984375,
        ro.target_log_prob,
        ro.behavior_log_prob,
        ro.value,
        ro.next_value,
        ro.reward,
        ro.done,
        ro.terminated,
        rho_thresh=1.0,
        c_thresh=0.5,
    )
    vs, adv = nostall.vtrace(
        ro.behavior_log_prob,
        ro.target_log_prob,
        ro.reward,
        ro.value,
        ro.next_value,
        ro.done,
        ro.terminated,
        0.984375,
        1.0,
        0.5,
    )
    torch.testing.assert_close(vs, want_vs, **TOL[dtype])
    torch.testing.assert_close(adv, want_adv, **TOL[dtype])


def test_gae_truncation_bootstraps_and_termination_does_not():
    # One env, three steps: a truncation after step 0, a termination at step 2.
    reward = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    value = torch.tensor([[0.5], [0.25], [0.125]], dtype=torch.float64)
    next_value = torch.tensor([[10.0], [0.125], [99.0]], dtype=torch.float64)
    done = torch.tensor([[True], [False], [True]])
    terminated = torch.tensor([[False], [False], [True]])
    gamma, lmbda = 0.5, 0.5
    adv, target = nostall.gae(reward, value, next_value, done, terminated, gamma, lmbda)
    delta2 = 3.0 - 0.125  # terminal: no bootstrap from 99
    delta1 = 2.0 + gamma * 0.125 - 0.25
    delta0 = 1.0 + gamma * 10.0 - 0.5  # truncated: bootstraps from the final observation
    want = torch.tensor([[delta0], [delta1 + gamma * lmbda * delta2], [delta2]])
    torch.testing.assert_close(adv, want.double())
    torch.testing.assert_close(target, want.double() + value)


def test_discounted_returns_is_gae_target_with_lambda_one():
    ro = make_rollout(200, 9, seed=3)
    returns = nostall.discounted_returns(ro.reward, ro.done, ro.terminated, ro.next_value, 0.9)
    _, target = nostall.gae(ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.9, 1.0)
    torch.testing.assert_close(returns, target, rtol=1e-10, atol=1e-10)


def test_vtrace_on_policy_equals_gae_lambda_one():
    # With target == behaviour and unclipped weights, v_s reduces to the lambda = 1 return.
    ro = make_rollout(100, 5, seed=4)
    vs, _ = nostall.vtrace(
        ro.behavior_log_prob,
        ro.behavior_log_prob,
        ro.reward,
        ro.value,
        ro.next_value,
        ro.done,
        ro.terminated,
        0.9,
        1.0,
        1.0,
    )
    _, target = nostall.gae(ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.9, 1.0)
    torch.testing.assert_close(vs, target, rtol=1e-10, atol=1e-10)


def test_non_contiguous_inputs_give_the_contiguous_answer(device):
    ro = make_rollout(40, 6, seed=5).to(device)
    # Transposed storage: the same values, column-major in memory.
    nc = [x.t().contiguous().t() for x in (ro.reward, ro.value, ro.next_value)]
    flags = [x.t().contiguous().t() for x in (ro.done, ro.terminated)]
    assert not nc[0].is_contiguous()
    got = nostall.gae(*nc, *flags, 0.99, 0.95)
    want = nostall.gae(ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.99, 0.95)
    for g, w in zip(got, want, strict=True):
        assert g.is_contiguous()
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    got_r = nostall.discounted_returns(nc[0], *flags, nc[2], 0.9)
    want_r = nostall.discounted_returns(ro.reward, ro.done, ro.terminated, ro.next_value, 0.9)
    torch.testing.assert_close(got_r, want_r, rtol=0, atol=0)
    lp = [x.t().contiguous().t() for x in (ro.behavior_log_prob, ro.target_log_prob)]
    got_v = nostall.vtrace(*lp, *nc, *flags)
    want_v = nostall.vtrace(
        ro.behavior_log_prob,
        ro.target_log_prob,
        ro.reward,
        ro.value,
        ro.next_value,
        ro.done,
        ro.terminated,
    )
    for g, w in zip(got_v, want_v, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_wide_rollout_uses_many_column_bands_and_agrees():
    # Wide enough that parallel_for splits the columns across threads.
    ro = make_rollout(64, 4099, torch.float32, seed=6)
    args = (ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.99, 0.95)
    for got, want in zip(nostall.gae(*args), reference.gae(*args), strict=True):
        torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_past_the_cache_streams_its_outputs_and_gives_the_same_bits(dtype):
    """Outputs of 4 MiB or more take the streaming kernel (non-temporal stores): the same
    arithmetic, so each column equals, bit for bit, what the plain kernel gives for that column
    alone; N is odd so rows start unaligned and the head and tail paths run too."""
    T, N = 1024, 1031 if dtype == torch.float32 else 517  # >= 4 MiB per output either way
    ro = make_rollout(T, N, dtype, seed=5)
    args = (ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.97, 0.9)
    advantage, target = nostall.gae(*args)
    for cols in (slice(0, 3), slice(500, 517), slice(N - 5, N)):
        narrow = [x[:, cols].contiguous() for x in args[:5]]  # small: the plain kernel
        want_adv, want_target = nostall.gae(*narrow, 0.97, 0.9)
        assert torch.equal(advantage[:, cols], want_adv)
        assert torch.equal(target[:, cols], want_target)
    for got, want in zip((advantage, target), reference.gae(*args), strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype])
