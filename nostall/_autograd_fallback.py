"""The autograd formulas of the native ops in Python, for a torch the native autograd library
was not built for.

`nostall._C` (schemas and kernels) uses the stable ABI and loads under every torch from 2.10
on; `nostall._C_autograd` (csrc/autograd/) needs the regular C++ ABI, which the stable one does
not cover, so it is bound to the torch it was built against. Where it cannot load, these
registrations (torch.library.register_autograd) attach the same formulas: every backward is the
same native backward op, the same outputs are non-differentiable, the same targets are refused
when they require grad, and the same second derivatives exist (gae and discounted_returns,
whose adjoints are linear) or are refused. What differs is the cost: a Python autograd kernel
adds about 0.1-0.5 ms to a differentiable call's forward and backward
(benchmarks/autograd_fallback.py; figures in benchmarks/RESULTS.md).

Keep this file in step with csrc/autograd/*.cpp; tests/ops/test_autograd_fallback.py runs the
op tests under it.
"""

from __future__ import annotations

import torch

ops = torch.ops.nostall


def _refuse_second_derivative(op: str):
    raise RuntimeError(
        f"nostall::{op} has no second derivative: nostall::{op}_backward is not "
        "differentiable (an input of it requires grad)"
    )


def _no_second_derivative(op: str):
    """A setup_context for op's backward op: called only when an input requires grad."""
    return lambda ctx, inputs, output: _refuse_second_derivative(op)


def _unused_backward(ctx, *grads):  # never reached: setup_context refuses first
    raise RuntimeError("unreachable")


def _refuse_targets(op: str, **targets) -> None:
    for name, t in targets.items():
        if t is not None and t.requires_grad:
            raise RuntimeError(
                f"{name} must not require grad: {op} treats it as a constant (detach it)"
            )


# -- advantages: linear recurrences, so each backward's backward is the forward ---------------
def _save_boundaries(ctx, done, terminated, gamma, lmbda=1.0):
    ctx.save_for_backward(done, terminated)
    ctx.gamma, ctx.lmbda = gamma, lmbda


def _gae_setup(ctx, inputs, output):
    _, _, _, done, terminated, gamma, lmbda = inputs
    _save_boundaries(ctx, done, terminated, gamma, lmbda)


def _gae_backward(ctx, grad_advantage, grad_value_target):
    done, terminated = ctx.saved_tensors
    gr, gv, gnv = ops.gae_backward(
        grad_advantage, grad_value_target, done, terminated, ctx.gamma, ctx.lmbda
    )
    return gr, gv, gnv, None, None, None, None


def _gae_backward_setup(ctx, inputs, output):
    _, _, done, terminated, gamma, lmbda = inputs
    _save_boundaries(ctx, done, terminated, gamma, lmbda)


def _gae_backward_backward(ctx, h_reward, h_value, h_next_value):
    done, terminated = ctx.saved_tensors
    advantage, value_target = ops.gae(
        h_reward, h_value, h_next_value, done, terminated, ctx.gamma, ctx.lmbda
    )
    return advantage, value_target, None, None, None, None


def _returns_setup(ctx, inputs, output):
    _, done, terminated, _, gamma = inputs
    _save_boundaries(ctx, done, terminated, gamma)


def _returns_backward(ctx, grad):
    done, terminated = ctx.saved_tensors
    gr, gb = ops.discounted_returns_backward(grad, done, terminated, ctx.gamma)
    return gr, None, None, gb, None


def _returns_backward_setup(ctx, inputs, output):
    _, done, terminated, gamma = inputs
    _save_boundaries(ctx, done, terminated, gamma)


def _returns_backward_backward(ctx, h_reward, h_bootstrap):
    done, terminated = ctx.saved_tensors
    returns = ops.discounted_returns(h_reward, done, terminated, h_bootstrap, ctx.gamma)
    return returns, None, None, None


def _vtrace_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(*output)


def _vtrace_backward(ctx, *grads):
    raise RuntimeError("nostall::vtrace outputs are targets and are not differentiable")


# -- losses ------------------------------------------------------------------------------------
def _group_advantages_setup(ctx, inputs, output):
    reward, group_index, num_groups, scale, eps = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(reward, group_index)
    ctx.num_groups, ctx.scale, ctx.eps = num_groups, scale, eps


def _group_advantages_backward(ctx, grad):
    if grad is None:
        return None, None, None, None, None
    reward, group_index = ctx.saved_tensors
    g = ops.group_advantages_backward(grad, reward, group_index, ctx.num_groups, ctx.scale, ctx.eps)
    return g, None, None, None, None


def _token_log_prob_setup(ctx, inputs, output):
    logits, tokens = inputs
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(logits, tokens, output[1])


def _token_log_prob_backward(ctx, grad, _):
    if grad is None:
        return None, None
    return ops.token_log_prob_backward(grad, *ctx.saved_tensors), None


def _token_log_prob_linear_setup(ctx, inputs, output):
    hidden, weight, tokens, chunk_size = inputs
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(hidden, weight, tokens, output[1])
    ctx.chunk_size = chunk_size


def _token_log_prob_linear_backward(ctx, grad, _):
    if grad is None:
        return None, None, None, None
    gh, gw = ops.token_log_prob_linear_backward(grad, *ctx.saved_tensors, ctx.chunk_size)
    return gh, gw, None, None


def _token_entropy_linear_setup(ctx, inputs, output):
    hidden, weight, chunk_size = inputs
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(hidden, weight, output[0], output[1])
    ctx.chunk_size = chunk_size


def _token_entropy_linear_backward(ctx, grad, _):
    if grad is None:
        return None, None, None
    gh, gw = ops.token_entropy_linear_backward(grad, *ctx.saved_tensors, ctx.chunk_size)
    return gh, gw, None


def _policy_loss_setup(ctx, inputs, output):
    _, old_log_prob, advantage, mask, _, _, aggregation, max_tokens, _, behavior, _ = inputs
    _refuse_targets(
        "clipped_policy_loss",
        old_log_prob=old_log_prob,
        advantage=advantage,
        behavior_log_prob=behavior,
    )
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(output[3], mask)
    ctx.aggregation, ctx.max_tokens = aggregation, max_tokens


def _policy_loss_backward(ctx, grad, *_):
    if grad is None:
        return (None,) * 11
    if torch.is_grad_enabled():
        _refuse_second_derivative("clipped_policy_loss")
    token_grad, mask = ctx.saved_tensors
    g = ops.clipped_policy_loss_backward(grad, token_grad, mask, ctx.aggregation, ctx.max_tokens)
    return (g,) + (None,) * 10


def _ppo_setup(op: str):
    def setup(ctx, inputs, output):
        old_log_prob, old_value, advantage, value_target = inputs[3:7]
        _refuse_targets(
            op,
            old_log_prob=old_log_prob,
            old_value=old_value,
            advantage=advantage,
            value_target=value_target,
        )
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(output[2], output[3])
        ctx.ent_coef = inputs[9]

    return setup


def _ppo_loss_backward(ctx, grad, *_):
    if grad is None:
        return (None,) * 12
    if torch.is_grad_enabled():
        _refuse_second_derivative("ppo_loss")
    grad_logits, grad_value = ops.ppo_loss_backward(grad, *ctx.saved_tensors)
    return (grad_logits, None, grad_value) + (None,) * 9


def _ppo_log_prob_loss_backward(ctx, grad, *_):
    if grad is None:
        return (None,) * 12
    if torch.is_grad_enabled():
        _refuse_second_derivative("ppo_loss_from_log_prob")
    g_log_prob, g_entropy, g_value = ops.ppo_loss_from_log_prob_backward(
        grad, *ctx.saved_tensors, ctx.ent_coef
    )
    return (g_log_prob, g_entropy, g_value) + (None,) * 9


# -- networks ----------------------------------------------------------------------------------
def _mlp_setup(ctx, inputs, output):
    x, weights, _, activation = inputs
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(*output[1])
    ctx.save_for_backward(x, *weights, *output[1])
    ctx.layers, ctx.activation, ctx.input_grad = len(weights), activation, x.requires_grad


def _mlp_backward(ctx, grad, _):
    L = ctx.layers
    if grad is None:
        return None, [None] * L, [None] * L, None
    saved = ctx.saved_tensors
    x, weights, hidden = saved[0], list(saved[1 : 1 + L]), list(saved[1 + L :])
    gx, gw, gb = ops.mlp_backward(grad, x, weights, hidden, ctx.activation, ctx.input_grad)
    return gx, list(gw), list(gb), None


def _sample_setup(ctx, inputs, output):
    logits, uniform = inputs
    _refuse_targets("sample_categorical", uniform=uniform)
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(logits, output[1], output[2])


def _sample_backward(ctx, grad, *_):
    if grad is None:
        return None, None
    logits, action, logsumexp = ctx.saved_tensors
    # token_log_prob's adjoint over a batch of one sequence: [N, A] logits as [1, N, A].
    g = ops.token_log_prob_backward(grad[None], logits[None], action[None], logsumexp[None])
    return g[0], None


REGISTRATIONS = {
    "gae": (_gae_backward, _gae_setup),
    "gae_backward": (_gae_backward_backward, _gae_backward_setup),
    "discounted_returns": (_returns_backward, _returns_setup),
    "discounted_returns_backward": (_returns_backward_backward, _returns_backward_setup),
    "vtrace": (_vtrace_backward, _vtrace_setup),
    "group_advantages": (_group_advantages_backward, _group_advantages_setup),
    "token_log_prob": (_token_log_prob_backward, _token_log_prob_setup),
    "token_log_prob_linear": (_token_log_prob_linear_backward, _token_log_prob_linear_setup),
    "token_entropy_linear": (_token_entropy_linear_backward, _token_entropy_linear_setup),
    "clipped_policy_loss": (_policy_loss_backward, _policy_loss_setup),
    "ppo_loss": (_ppo_loss_backward, _ppo_setup("ppo_loss")),
    "ppo_loss_from_log_prob": (_ppo_log_prob_loss_backward, _ppo_setup("ppo_loss_from_log_prob")),
    "mlp": (_mlp_backward, _mlp_setup),
    "sample_categorical": (_sample_backward, _sample_setup),
}
# The backward ops of the non-linear formulas: called with an input that requires grad (a
# double backward), they refuse, as the native kernels do.
REFUSING = (
    "group_advantages",
    "token_log_prob",
    "token_log_prob_linear",
    "token_entropy_linear",
    "clipped_policy_loss",
    "ppo_loss",
    "ppo_loss_from_log_prob",
    "mlp",
)


def register() -> None:
    """Attaches the formulas above to the ops (once; the native autograd library not loaded)."""
    for name, (backward, setup) in REGISTRATIONS.items():
        torch.library.register_autograd(f"nostall::{name}", backward, setup_context=setup)
    for name in REFUSING:
        torch.library.register_autograd(
            f"nostall::{name}_backward", _unused_backward, setup_context=_no_second_derivative(name)
        )
