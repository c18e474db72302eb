"""Bad input to the advantage ops: a clear error naming the argument, eager and compiled."""

import pytest
import torch

import nostall
from tests.ops.rollouts import make_rollout


def gae_args(**override):
    ro = make_rollout(5, 3, torch.float32, seed=1)
    args = dict(
        reward=ro.reward,
        value=ro.value,
        next_value=ro.next_value,
        done=ro.done,
        terminated=ro.terminated,
        gamma=0.99,
        lmbda=0.95,
    )
    args.update(override)
    return args


BAD_GAE = [
    ("value", dict(value=torch.zeros(5, 4)), "value must have the shape of reward"),
    ("next_value", dict(next_value=torch.zeros(4, 3)), "next_value must have the shape"),
    ("reward_1d", dict(reward=torch.zeros(5)), "reward must be a time-major"),
    ("reward_int", dict(reward=torch.zeros(5, 3, dtype=torch.int64)), "reward must be float"),
    ("reward_half", dict(reward=torch.zeros(5, 3, dtype=torch.float16)), "reward must be float"),
    ("mixed_dtype", dict(value=torch.zeros(5, 3, dtype=torch.float64)), "value must have the dty"),
    ("done_float", dict(done=torch.zeros(5, 3)), "done must be bool"),
    ("terminated_int", dict(terminated=torch.zeros(5, 3, dtype=torch.int32)), "terminated must"),
    ("done_shape", dict(done=torch.zeros(5, 2, dtype=torch.bool)), "done must have the shape"),
    ("gamma_high", dict(gamma=1.5), "gamma must lie in \\[0, 1\\]"),
    ("gamma_negative", dict(gamma=-0.1), "gamma must lie in \\[0, 1\\]"),
    ("gamma_nan", dict(gamma=float("nan")), "gamma must lie in \\[0, 1\\]"),
    ("lmbda_high", dict(lmbda=1.01), "lmbda must lie in \\[0, 1\\]"),
]


def _empty_gae(T: int, N: int):
    z = torch.zeros(T, N)
    f = torch.zeros(T, N, dtype=torch.bool)
    return dict(reward=z, value=z, next_value=z, done=f, terminated=f)


BAD_GAE += [
    ("T_zero", _empty_gae(0, 3), "reward must have T >= 1 and N >= 1"),
    ("N_zero", _empty_gae(4, 0), "reward must have T >= 1 and N >= 1"),
]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case,override,message", BAD_GAE, ids=[c[0] for c in BAD_GAE])
def test_gae_rejects(case, override, message, compiled):
    fn = nostall.gae
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(nostall.gae, fullgraph=True, dynamic=False)
    with pytest.raises(RuntimeError, match=message):
        fn(**gae_args(**override))


def test_gamma_as_tensor_is_refused_rather_than_synced():
    with pytest.raises(TypeError, match="gamma must be a Python number"):
        nostall.gae(**gae_args(gamma=torch.tensor(0.9)))


def test_discounted_returns_rejects():
    ro = make_rollout(5, 3, seed=2)
    with pytest.raises(RuntimeError, match="bootstrap_value must have the shape of reward"):
        nostall.discounted_returns(ro.reward, ro.done, ro.terminated, ro.value[:, :2], 0.9)
    with pytest.raises(RuntimeError, match="bootstrap_value must have the dtype of reward"):
        nostall.discounted_returns(ro.reward, ro.done, ro.terminated, ro.value.float(), 0.9)
    with pytest.raises(RuntimeError, match="done must be bool"):
        nostall.discounted_returns(ro.reward, ro.done.double(), ro.terminated, ro.value, 0.9)
    with pytest.raises(RuntimeError, match="gamma must lie in"):
        nostall.discounted_returns(ro.reward, ro.done, ro.terminated, ro.value, 2.0)


def test_vtrace_rejects():
    ro = make_rollout(5, 3, seed=3)
    base = [
        ro.behavior_log_prob,
        ro.target_log_prob,
        ro.reward,
        ro.value,
        ro.next_value,
        ro.done,
        ro.terminated,
    ]
    with pytest.raises(RuntimeError, match="behavior_log_prob must have the shape of reward"):
        nostall.vtrace(ro.behavior_log_prob[:4], *base[1:])
    with pytest.raises(RuntimeError, match="target_log_prob must have the dtype of reward"):
        nostall.vtrace(base[0], ro.target_log_prob.float(), *base[2:])
    with pytest.raises(RuntimeError, match="rho_bar must be a positive finite number"):
        nostall.vtrace(*base, 0.9, 0.0, 1.0)
    with pytest.raises(RuntimeError, match="c_bar must be a positive finite number"):
        nostall.vtrace(*base, 0.9, 1.0, float("inf"))
    with pytest.raises(RuntimeError, match="c_bar must be a positive finite number"):
        nostall.vtrace(*base, 0.9, 1.0, -1.0)


def test_backward_ops_reject():
    ro = make_rollout(5, 3, seed=4)
    ops = torch.ops.nostall
    with pytest.raises(RuntimeError, match="grad_value_target must have the shape"):
        ops.gae_backward(ro.reward, ro.value[:3], ro.done, ro.terminated, 0.9, 0.9)
    with pytest.raises(RuntimeError, match="grad_returns must be float32 or float64"):
        ops.discounted_returns_backward(ro.done, ro.done, ro.terminated, 0.9)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")
def test_mixed_devices_are_rejected():
    with pytest.raises(RuntimeError, match="must be on the device of reward"):
        nostall.gae(**gae_args(value=torch.zeros(5, 3, device="cuda")))


def test_mixed_devices_are_rejected_without_a_gpu():
    # Without a GPU, meta tensors stand in for a second device.
    with pytest.raises(RuntimeError, match="value must be on the device of reward"):
        torch.ops.nostall.gae(**gae_args(value=torch.zeros(5, 3, device="meta")))
