"""Autograd formulas for the advantage ops. Each backward is itself a native op, and each
backward op's own backward is the forward op again (the recurrences are linear), so gradients
of any order stay native.

gae and discounted_returns are linear in (reward, value, next_value) and (reward,
bootstrap_value). vtrace produces targets (IMPALA treats them as constants), so its outputs are
explicitly non-differentiable: they never require grad, instead of silently getting zero
gradient as a C++ op without autograd registration would.
"""

import torch

ops = torch.ops.nostall


def _save_boundaries(ctx, inputs, done_index: int) -> None:
    done, terminated = inputs[done_index], inputs[done_index + 1]
    ctx.save_for_backward(done, terminated)
    ctx.scalars = inputs[done_index + 2 :]


# gae(reward, value, next_value, done, terminated, gamma, lmbda)
def _gae_setup(ctx, inputs, output):
    _save_boundaries(ctx, inputs, done_index=3)


def _gae_backward(ctx, grad_advantage, grad_value_target):
    done, terminated = ctx.saved_tensors
    grads = ops.gae_backward(grad_advantage, grad_value_target, done, terminated, *ctx.scalars)
    return (*grads, None, None, None, None)


# gae_backward(grad_advantage, grad_value_target, done, terminated, gamma, lmbda)
def _gae_backward_setup(ctx, inputs, output):
    _save_boundaries(ctx, inputs, done_index=2)


def _gae_backward_backward(ctx, grad_reward, grad_value, grad_next_value):
    # The adjoint of the adjoint: delta = grad_reward + gamma*grad_next_value - grad_value is
    # exactly what gae computes from (reward, next_value, value) = these gradients.
    done, terminated = ctx.saved_tensors
    advantage, value_target = ops.gae(
        grad_reward, grad_value, grad_next_value, done, terminated, *ctx.scalars
    )
    return advantage, value_target, None, None, None, None


# discounted_returns(reward, done, terminated, bootstrap_value, gamma)
def _returns_setup(ctx, inputs, output):
    _, done, terminated, _, gamma = inputs
    ctx.save_for_backward(done, terminated)
    ctx.gamma = gamma


def _returns_backward(ctx, grad_returns):
    done, terminated = ctx.saved_tensors
    grad_reward, grad_bootstrap = ops.discounted_returns_backward(
        grad_returns, done, terminated, ctx.gamma
    )
    return grad_reward, None, None, grad_bootstrap, None


# discounted_returns_backward(grad_returns, done, terminated, gamma)
def _returns_backward_setup(ctx, inputs, output):
    _save_boundaries(ctx, inputs, done_index=1)


def _returns_backward_backward(ctx, grad_grad_reward, grad_grad_bootstrap):
    done, terminated = ctx.saved_tensors
    grad = ops.discounted_returns(
        grad_grad_reward, done, terminated, grad_grad_bootstrap, *ctx.scalars
    )
    return grad, None, None, None


def _vtrace_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(*output)


def _vtrace_backward(ctx, grad_value_target, grad_pg_advantage):
    raise RuntimeError("nostall::vtrace outputs are targets and are not differentiable")


torch.library.register_autograd("nostall::gae", _gae_backward, setup_context=_gae_setup)
torch.library.register_autograd(
    "nostall::gae_backward", _gae_backward_backward, setup_context=_gae_backward_setup
)
torch.library.register_autograd(
    "nostall::discounted_returns", _returns_backward, setup_context=_returns_setup
)
torch.library.register_autograd(
    "nostall::discounted_returns_backward",
    _returns_backward_backward,
    setup_context=_returns_backward_setup,
)
torch.library.register_autograd("nostall::vtrace", _vtrace_backward, setup_context=_vtrace_setup)
