"""Compute precision: bfloat16 arithmetic over float32 master weights.

With `--dtype bfloat16` the trainer keeps the model it saves and checkpoints, and Adam's
moments, in float32 (the master weights, the optimizer's), and runs generation and the update's
forward and backward on a bfloat16 copy of them (the compute weights). Where the hardware has
bf16 arithmetic (a GPU; a CPU with AVX512-BF16 or AMX) its matrix products run 2-7x faster than
float32's, and the copy and its gradients cost 4 bytes a parameter: as many as the float32
gradients it saves.

Both copies are flat buffers in the same order (ClippedAdam's for the master, `pack` for the
compute copy), so one optimizer step is: the float32 Adam step on the compute copy's bf16
gradients, clipped by their float32 norm and widened a chunk at a time (no float32 gradient
buffer: 4 bytes a parameter less than float32 training holds), then the master rounded into
the compute copy (one narrowing op). On the CPU all of that is one native pass over the buffers
(`nostall::clipped_adam_step_bf16`, on torch's threads). With gradient accumulation the
micro-batches' gradients are summed in a float32 buffer first (the sum is float32's).
"""

from __future__ import annotations

import copy

import torch

from nostall.optim import ClippedAdam, float32_norm, pack

DTYPES = ("auto", "float32", "bfloat16")
MASTER_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # --master-dtype


def bf16_hardware(device: torch.device) -> bool:
    """Whether `device` does bf16 arithmetic natively: CUDA with bf16 support, or a CPU with
    AVX512-BF16 or AMX (elsewhere bf16 is emulated and slower than float32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())


def compute_dtype(name: str, device: torch.device, builtin: bool) -> torch.dtype:
    """The run's compute dtype for `--dtype name`. auto: bfloat16 where the hardware has it,
    for a real model (a directory or a model object); float32 for the built-in toy models,
    whose time is per-op overhead, not arithmetic (bf16's casts would only add to it)."""
    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    return torch.bfloat16 if not builtin and bf16_hardware(device) else torch.float32


def compute_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `model` with its floating-point parameters in `dtype`, cast tensor by tensor
    (no float32 copy of the whole model on the way); tied parameters stay tied, buffers (rotary
    tables) stay as they are."""
    memo: dict[int, object] = {}
    for param in model.parameters():
        if id(param) not in memo:
            kind = dtype if param.is_floating_point() else param.dtype
            cast = param.detach().to(kind, copy=True)  # (one copy, cast or not)
            memo[id(param)] = torch.nn.Parameter(cast, requires_grad=param.requires_grad)
    return copy.deepcopy(model, memo)


class MasterWeights:
    """The optimizer's float32 model and its compute copy (see the module's docstring). Stands
    in for the optimizer in the update: `zero_grad`, `collect_gradients` after each backward,
    `apply_gradients`."""

    def __init__(
        self,
        master: torch.nn.Module,
        optimizer: ClippedAdam,
        compute: torch.nn.Module,
        accumulate: int = 1,
    ):
        """`optimizer`: a ClippedAdam over `master`'s trained parameters with no gradient
        buffer of its own (gradients=False); `accumulate`: micro-batches an optimizer step
        sums (gradient_accumulation_steps)."""
        self.master, self.optimizer, self.compute = master, optimizer, compute
        names = {id(p): name for name, p in master.named_parameters()}
        by_name = dict(compute.named_parameters())
        order = [by_name[names[id(p)]] for p in optimizer.parameters_in_order]
        self.flat = pack(order)  # the compute copy's trained parameters, in the master's order
        self.flat_grad = torch.zeros_like(self.flat)
        self._order = order
        self._grads = [
            self.flat_grad[o - p.numel() : o].view_as(p)
            for p, o in zip(order, _ends(order), strict=True)
        ]
        self._reattach()
        self.accumulate = accumulate
        # With accumulation: the micro-batches' gradients summed in float32 (made on first use:
        # without it the step reads the bf16 gradients directly, a chunk at a time).
        self.summed: torch.Tensor | None = None
        self._collected = 0  # micro-batches summed since zero_grad

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    # The compute copy's side, laid out as a ClippedAdam's is (the update by explicit adjoints
    # writes its gradients straight into the flat buffer).
    @property
    def parameters_in_order(self) -> list[torch.nn.Parameter]:
        return list(self._order)

    @property
    def flat_gradient(self) -> torch.Tensor:
        return self.flat_grad

    def zero_grad(self) -> None:
        self._reattach()
        self.flat_grad.zero_()
        self._collected = 0

    @torch.no_grad()
    def collect_gradients(self) -> None:
        """After a micro-batch's backward. With accumulation: its gradients added into the
        float32 sum, and cleared for the next micro-batch."""
        if self.accumulate == 1:
            return
        summed = self._summed()
        if self._collected:
            summed.add_(self.flat_grad)
        else:
            summed.copy_(self.flat_grad)
        self._collected += 1
        self.flat_grad.zero_()

    @torch.no_grad()
    def apply_gradients(self, measure: bool = False) -> torch.Tensor | None:
        """The float32 step on the gradients (clipped by their float32 norm), then the compute
        copy rounded from the new master weights. With `measure`, returns that norm (a device
        tensor; the native rounding step takes it inside, so there one more pass)."""
        if self.accumulate == 1:
            norm = None
            if measure:  # (taken before the step, which may scale the gradient)
                norm = float32_norm(self.flat_grad)
            if self.optimizer.step_rounding(self.flat_grad, self.flat):
                self._collected = 0  # (the compute copy rounded in the same pass)
                return norm
            norm = self.optimizer.apply_flat_gradient(self.flat_grad)
        else:
            summed = self._summed()
            if not self._collected:  # (nothing back-propagated since zero_grad)
                summed.zero_()
            norm = self.optimizer.apply_flat_gradient(summed)
        self._collected = 0
        self.pull()
        return norm if measure else None

    def _summed(self) -> torch.Tensor:
        if self.summed is None:
            self.summed = torch.zeros(self.flat.shape, dtype=torch.float32, device=self.flat.device)
        return self.summed

    @torch.no_grad()
    def pull(self) -> None:
        """The compute copy's trained parameters rounded from the master's (after a step)."""
        self.flat.copy_(self.optimizer.flat_parameters)

    @torch.no_grad()
    def pull_all(self) -> None:
        """Every compute parameter rounded from its master (after a restore, which may also
        have loaded parameters the optimizer does not hold: a LoRA run's base weights)."""
        self.pull()
        masters = dict(self.master.named_parameters())
        for name, param in self.compute.named_parameters():
            param.copy_(masters[name])

    def _reattach(self) -> None:
        """The compute parameters' gradients are views of the flat buffer (backward adds into
        them in place), even after something reset them."""
        for p, grad in zip(self._order, self._grads, strict=True):
            if p.grad is not grad:
                p.grad = grad


def _ends(params: list[torch.Tensor]) -> list[int]:
    """Where each parameter ends in a flat buffer that lays them end to end."""
    ends, offset = [], 0
    for p in params:
        offset += p.numel()
        ends.append(offset)
    return ends
