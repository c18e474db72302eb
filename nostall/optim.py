"""Adam with global gradient-norm clipping in one lean step, for the trainers' minibatch loop.

A PPO minibatch on CartPole computes its gradients in about a millisecond; then
`clip_grad_norm_` and `Adam.step` (fused) took about 0.37 ms more, mostly per-tensor work and
Python: a norm, a scale, a step count and an update for each of the 12 parameter tensors,
grouping by device and dtype, re-reading the optimizer state, hooks.

ClippedAdam is a `torch.optim.Adam(fused=True)` (same state_dict format, so checkpoints move
between the two) that keeps its parameters, their gradients and both moments in four flat
buffers: every parameter's data and gradient is a view of its buffer, and a step is a handful
of ops on whole buffers. The global norm, the clip coefficient (a device tensor: no host sync)
and the fused Adam update of `clip_grad_norm_` followed by `Adam.step`, with one difference in
rounding: the norm is taken over the flat gradient at once, not as the norm of per-tensor norms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def pack(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Lays `params` end to end in one new buffer, in their order, each now a view of it (its
    `.data`); returns the buffer."""
    first = params[0]
    with torch.no_grad():
        # Copied in one at a time, each old tensor freed as its view replaces it: the model is
        # held about once on the way, not twice (as a torch.cat of all of them would).
        flat = torch.empty(sum(p.numel() for p in params), dtype=first.dtype, device=first.device)
        offset = 0
        for p in params:
            view = flat[offset : offset + p.numel()]
            view.copy_(p.detach().reshape(-1))
            p.data = view.view_as(p)
            offset += p.numel()
    return flat


@torch.no_grad()
def float32_norm(
    tensor: torch.Tensor, chunk: int = 1 << 22, wide: torch.Tensor | None = None
) -> torch.Tensor:
    """The 2-norm of a flat tensor of any floating dtype, summed in float32 a chunk at a time
    (the norm of the chunks' norms) through one reused float32 buffer, `wide` where given (a
    device tensor, not read). torch's own norm of a bf16 tensor either sums in bf16 (1e-2 off
    at 1e8 elements) or, asked for float32, copies the whole tensor first."""
    if wide is None and tensor.dtype != torch.float32:
        wide = torch.empty(min(chunk, tensor.numel()), dtype=torch.float32, device=tensor.device)
    norms = []
    for start in range(0, tensor.numel(), chunk):
        part = tensor[start : start + chunk]
        if part.dtype != torch.float32:
            part = wide[: part.numel()].copy_(part)
        norms.append(torch.linalg.vector_norm(part, 2.0))
    return torch.linalg.vector_norm(torch.stack(norms), 2.0)


class ClippedAdam(torch.optim.Adam):
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float | torch.Tensor,
        max_grad_norm: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        gradients: bool = True,
    ):
        """`gradients=False`: no gradient buffer of its own (nor `.grad` on the parameters);
        each step takes an outside flat gradient (`apply_flat_gradient`), as master weights
        stepped from a bf16 copy's gradients do (nostall.lm.precision)."""
        if not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm}")
        params = list(params)
        if any(isinstance(p, dict) for p in params):
            raise ValueError("ClippedAdam takes one parameter group (a list of parameters)")
        if not params:
            raise ValueError("ClippedAdam got no parameters")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("ClippedAdam got a parameter twice")
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) != 1:
            raise ValueError(
                f"ClippedAdam needs one dtype and device, got {sorted(map(str, kinds))}"
            )
        super().__init__(params, lr=lr, betas=betas, eps=eps, fused=True)
        self.max_grad_norm = max_grad_norm
        # Decoupled (AdamW's): the parameters shrink by lr * weight_decay before each step.
        # Kept out of the group's weight_decay, which is Adam's L2 term in torch's kernels.
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        self.weight_decay = weight_decay
        # Called on the flat gradient before clipping
        # (nostall.runtime.distributed.average_gradients).
        self.reduce_grad: Callable[[torch.Tensor], None] | None = None
        self._params = params
        self._flat_param = pack(params)  # the parameters now live in the flat buffer
        self._flat_grad = torch.zeros_like(self._flat_param) if gradients else None
        self._flat_exp_avg = torch.zeros_like(self._flat_param)
        self._flat_exp_avg_sq = torch.zeros_like(self._flat_param)
        self._step = torch.zeros((), dtype=torch.float32, device=self._flat_param.device)
        self._grads = self._views(self._flat_grad) if gradients else []
        for p, grad in zip(params, self._grads, strict=False):  # (none: gradients=False)
            p.grad = grad
        self._bind_state()

    @property
    def parameters_in_order(self) -> list[torch.nn.Parameter]:
        """The parameters, in the order they lie in the flat buffers."""
        return list(self._params)

    @property
    def flat_parameters(self) -> torch.Tensor:
        """Every parameter, end to end (the parameters are views of it)."""
        return self._flat_param

    @property
    def flat_gradient(self) -> torch.Tensor | None:
        """Every parameter's gradient, end to end; `step` reads it (None: gradients=False)."""
        return self._flat_grad

    def add_param_group(self, param_group: dict) -> None:
        # Optimizer.add_param_group is wrapped to be skipped by torch.compile, and the wrapper
        # imports torch._dynamo on its first call: about 3 s of a run's start-up here, for an
        # optimizer that is only ever called eagerly. The plain method does the same work.
        plain = getattr(torch.optim.Optimizer.add_param_group, "__wrapped__", None)
        if plain is None:  # a torch without the wrapper
            super().add_param_group(param_group)
        else:
            plain(self, param_group)

    def _flatten(self, tensors: Iterable[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors])

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        views, offset = [], 0
        for p in self._params:
            views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def _bind_state(self) -> None:
        """Adam's per-parameter state, as views of the flat moments (state_dict reads it)."""
        avgs, sqs = self._views(self._flat_exp_avg), self._views(self._flat_exp_avg_sq)
        for p, avg, sq in zip(self._params, avgs, sqs, strict=True):
            self.state[p] = {"step": self._step, "exp_avg": avg, "exp_avg_sq": sq}

    def state_dict(self) -> dict:
        state = super().state_dict()
        # Adam keeps one step tensor per parameter; ours share one. Give each entry a copy in
        # new dicts: Optimizer.state_dict returns the live per-parameter dicts, and writing
        # the copy into them would detach the optimizer's state from its step counter.
        state["state"] = {
            index: {**entry, "step": entry["step"].clone()}
            for index, entry in state["state"].items()
        }
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        with torch.no_grad():
            loaded = [self.state[p] for p in self._params]
            if all(s for s in loaded):
                self._flat_exp_avg.copy_(self._flatten(s["exp_avg"] for s in loaded))
                self._flat_exp_avg_sq.copy_(self._flatten(s["exp_avg_sq"] for s in loaded))
                self._step.copy_(loaded[0]["step"])
            else:  # saved before the first step
                self._flat_exp_avg.zero_()
                self._flat_exp_avg_sq.zero_()
                self._step.zero_()
        self._bind_state()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the flat gradient (the gradients stay views of it whatever set_to_none)."""
        if self._flat_grad is not None:
            self._flat_grad.zero_()

    @torch.no_grad()
    def step(self, closure=None) -> None:
        """Clips the gradients to a global 2-norm of max_grad_norm, then takes an Adam step."""
        if closure is not None:
            raise ValueError("ClippedAdam.step takes no closure")
        self.apply_gradients()

    @torch.no_grad()
    def _native_step_applies(self, group: dict) -> bool:
        """The step is one native op (nostall::clipped_adam_step, the same arithmetic in two
        passes) for float32 CPU buffers with a number for a learning rate and no weight decay;
        a GPU, another dtype or a tensor learning rate keep torch's ops below."""
        flat = self._flat_param
        return (
            flat.device.type == "cpu"
            and flat.dtype == torch.float32
            and not isinstance(group["lr"], torch.Tensor)
            and group["weight_decay"] == 0
            and not group["amsgrad"]
            and not group["maximize"]
        )

    def apply_gradients(self, measure: bool = False) -> torch.Tensor | None:
        """`step` without the wrapper torch.optim puts around it (step hooks and a profiler
        range: about 65 us a call, a tenth of the step), for a trainer that registers none.
        With `measure`, returns the gradients' global 2-norm before clipping (a device tensor,
        not read: transformers' grad_norm); the native step takes it inside and returns
        nothing, so there measuring is one more pass over the gradient."""
        if self._flat_grad is None:
            raise RuntimeError(
                "this ClippedAdam has no gradients of its own (gradients=False): "
                "step it with apply_flat_gradient"
            )
        for p, grad in zip(self._params, self._grads, strict=True):
            if p.grad is not grad:  # replaced from outside (module.zero_grad, assignment)
                if p.grad is None:
                    grad.zero_()
                else:
                    grad.copy_(p.grad)
                p.grad = grad
        if self.reduce_grad is not None:  # data-parallel ranks: the mean of their gradients
            self.reduce_grad(self._flat_grad)
        group = self._decayed_group()
        if self._native_step_applies(group):
            norm = torch.linalg.vector_norm(self._flat_grad, 2.0) if measure else None
            beta1, beta2 = group["betas"]
            torch.ops.nostall.clipped_adam_step(
                self._flat_param,
                self._flat_grad,
                self._flat_exp_avg,
                self._flat_exp_avg_sq,
                self._step,
                group["lr"],
                beta1,
                beta2,
                group["eps"],
                self.max_grad_norm,
            )
            return norm
        norm = torch.linalg.vector_norm(self._flat_grad, 2.0)
        self._flat_grad.mul_(self._clip(norm))
        self._step.add_(1)
        self._adam(group, slice(None), self._flat_grad)
        return norm if measure else None

    @torch.no_grad()
    def step_rounding(self, grad: torch.Tensor, rounded: torch.Tensor) -> bool:
        """The step on a bf16 flat gradient in the parameters' order (a bf16 copy's), which
        also rounds the new parameters into `rounded` (that copy, the same order): one native
        op and one pass over the buffers (nostall::clipped_adam_step_bf16) where it applies
        (`_native_step_applies`, the CPU); False and nothing done elsewhere (then
        `apply_flat_gradient`, and the copy refreshed after)."""
        applies = (
            self._native_step_applies(self.param_groups[0])
            and grad.dtype == rounded.dtype == torch.bfloat16
            and grad.device.type == rounded.device.type == "cpu"
        )
        if not applies:
            return False
        group = self.param_groups[0]  # (no weight decay: the native step applies without it)
        beta1, beta2 = group["betas"]
        torch.ops.nostall.clipped_adam_step_bf16(
            self._flat_param,
            grad,
            self._flat_exp_avg,
            self._flat_exp_avg_sq,
            self._step,
            rounded,
            group["lr"],
            beta1,
            beta2,
            group["eps"],
            self.max_grad_norm,
        )
        return True

    def collect_gradients(self) -> None:
        """After a micro-batch's backward: nothing to do (its gradients accumulate in place in
        the flat buffer). MasterWeights, which stands in for the optimizer, collects there."""

    def _decayed_group(self) -> dict:
        """The parameter group, after the decoupled weight decay of this step."""
        group = self.param_groups[0]
        if self.weight_decay:
            self._flat_param.mul_(1.0 - group["lr"] * self.weight_decay)
        return group

    def _clip(self, total_norm: torch.Tensor) -> torch.Tensor:
        """The clip coefficient for a global gradient norm (a device tensor: no host read)."""
        return torch.clamp(self.max_grad_norm / (total_norm + 1e-6), max=1.0)

    def _adam(self, group: dict, part: slice, grad: torch.Tensor) -> None:
        """torch's fused Adam on `part` of the flat buffers, with gradient `grad` (the step
        counter already advanced)."""
        beta1, beta2 = group["betas"]
        torch._fused_adam_(
            [self._flat_param[part]],
            [grad],
            [self._flat_exp_avg[part]],
            [self._flat_exp_avg_sq[part]],
            [],
            [self._step],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            amsgrad=False,
            maximize=False,
        )

    @torch.no_grad()
    def apply_flat_gradient(self, grad: torch.Tensor, chunk: int = 1 << 22) -> torch.Tensor:
        """The step on an outside flat gradient in the parameters' order, of any floating dtype
        (a bf16 copy's): clipped to max_grad_norm by its norm taken in float32, and widened a
        chunk at a time, so no float32 copy of the whole gradient is ever held. Returns that
        norm (a device tensor, not read)."""
        if grad.shape != self._flat_param.shape:
            shape = tuple(self._flat_param.shape)
            raise ValueError(
                f"grad must be the flat gradient, of shape {shape}, got {tuple(grad.shape)}"
            )
        group = self._decayed_group()
        parts = [slice(start, start + chunk) for start in range(0, grad.numel(), chunk)]
        # One float32 chunk, reused: fresh temporaries a chunk each (with the small norms
        # allocated between them) fragmented the heap by about a whole float32 gradient.
        wide = torch.empty(
            min(chunk, grad.numel()), dtype=self._flat_param.dtype, device=grad.device
        )

        def widened(part: slice) -> torch.Tensor:
            out = wide[: grad[part].numel()]
            return out.copy_(grad[part])

        norm = float32_norm(grad, chunk, wide)
        clip = self._clip(norm)
        self._step.add_(1)
        for part in parts:
            self._adam(group, part, widened(part).mul_(clip))
        return norm
