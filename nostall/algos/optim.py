"""Adam with global gradient-norm clipping in one lean step, for the trainers' minibatch loop.

A PPO minibatch on CartPole computes its gradients in about a millisecond; then
`clip_grad_norm_` and `Adam.step` (fused) took about 0.33 ms more, almost all of it Python:
grouping tensors by device and dtype, re-reading the optimizer state, profiler hooks, on every
call. ClippedAdam is a `torch.optim.Adam(fused=True)` (same state, same checkpoints, same
kernel) whose `step` keeps its tensor lists between calls and runs only the kernels: the
gradients' norms, the clip coefficient (a device tensor: no host sync), and the fused Adam
update, with the arithmetic of `clip_grad_norm_(foreach=True)` followed by `Adam.step`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class ClippedAdam(torch.optim.Adam):
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float | torch.Tensor,
        max_grad_norm: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ):
        if not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, fused=True)
        if len(self.param_groups) != 1:
            raise ValueError("ClippedAdam takes one parameter group")
        self.max_grad_norm = max_grad_norm
        self._lists: tuple[list[torch.Tensor], ...] | None = None

    def _state_lists(self) -> tuple[list[torch.Tensor], ...]:
        """(params, exp_avgs, exp_avg_sqs, steps), the state made as Adam makes it."""
        if self._lists is None:
            params = self.param_groups[0]["params"]
            for p in params:
                state = self.state[p]
                if not state:  # what Adam's _init_group does for fused=True
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            self._lists = (
                list(params),
                [self.state[p]["exp_avg"] for p in params],
                [self.state[p]["exp_avg_sq"] for p in params],
                [self.state[p]["step"] for p in params],
            )
        return self._lists

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._lists = None  # the state tensors were replaced

    @torch.no_grad()
    def step(self, closure=None) -> None:
        """Clips the gradients to a global 2-norm of max_grad_norm, then takes an Adam step."""
        if closure is not None:
            raise ValueError("ClippedAdam.step takes no closure")
        params, exp_avgs, exp_avg_sqs, steps = self._state_lists()
        grads = [p.grad for p in params]
        if any(g is None for g in grads):
            raise RuntimeError("ClippedAdam.step: every parameter needs a gradient")
        group = self.param_groups[0]
        total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        clip = torch.clamp(self.max_grad_norm / (total_norm + 1e-6), max=1.0)
        torch._foreach_mul_(grads, clip)
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        torch._fused_adam_(
            params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=group["lr"], beta1=beta1,
            beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False,
            maximize=False,
        )  # fmt: skip
