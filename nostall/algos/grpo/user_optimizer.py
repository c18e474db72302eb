"""TRL's `optimizers=(optimizer, lr_scheduler)`, honoured by nostall's own optimizer.

nostall steps its fused AdamW over a flat copy of the parameters, so a user's torch optimizer is
not stepped: its hyperparameters (the rate, betas, epsilon, decoupled weight decay) become the
run's, and a user's scheduler sets the rate: it is stepped once per optimizer step, as
transformers steps it, and each generation batch trains at the rate it gives at the batch's
first optimizer step (nostall's own schedules are per batch alike). What cannot be carried over
(another optimizer class, per-group settings, AMSGrad, an optimizer already stepped, a scheduler
that needs a metric) is refused naming what to use."""

from __future__ import annotations

import warnings

import torch

from nostall.algos.grpo.config import GRPOConfig

# Adam's own settings: those the fused AdamW has (read into the run's config) and those it
# has not (refused unless at their defaults).
_CARRIED = ("lr", "betas", "eps", "weight_decay")
_REFUSED = {"amsgrad": False, "maximize": False}


class UserSchedule:
    """The user's scheduler, stepped to the run's optimizer step: the rate it gives."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler):
        self.optimizer, self.scheduler = optimizer, scheduler

    def rate_at(self, optimizer_steps: int) -> float:
        """The rate after `optimizer_steps` steps since the run began (the scheduler stepped
        forward to there: after a resume it is loaded or replayed, both the same schedule)."""
        with warnings.catch_warnings():
            # (torch warns when a scheduler steps before its optimizer ever has: this one never
            # is stepped, nostall's optimizer trains at the rate the schedule gives)
            warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
            while self.scheduler.last_epoch < optimizer_steps:
                self.scheduler.step()
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


def take_optimizers(optimizers, model, peft_config, args: GRPOConfig) -> UserSchedule | None:
    """The pair's settings written into `args`; the scheduler's schedule (None: the config's
    lr_scheduler_type, over the optimizer's rate where one is given)."""
    if optimizers is None:
        return None
    if not isinstance(optimizers, tuple | list) or len(optimizers) != 2:
        raise ValueError(
            f"optimizers: a pair (optimizer, lr_scheduler), either one None; got {optimizers!r}"
        )
    optimizer, scheduler = optimizers
    if optimizer is None:
        if scheduler is not None:
            raise ValueError(
                "optimizers: an lr_scheduler needs the optimizer it was built over "
                "(give (optimizer, lr_scheduler))"
            )
        return None
    _check_optimizer(optimizer, model, peft_config)
    group = optimizer.param_groups[0]
    beta1, beta2 = group["betas"]
    args.set_given(
        learning_rate=float(group.get("initial_lr", group["lr"])),
        adam_beta1=float(beta1),
        adam_beta2=float(beta2),
        adam_epsilon=float(group["eps"]),
        weight_decay=float(group["weight_decay"]),
    )
    if scheduler is None:
        return None
    _check_scheduler(scheduler, optimizer)
    return UserSchedule(optimizer, scheduler)


def _check_optimizer(optimizer, model, peft_config) -> None:
    if not isinstance(optimizer, torch.optim.Adam):  # (AdamW is an Adam)
        raise ValueError(
            f"optimizers: {type(optimizer).__name__} is not an Adam; nostall steps its own "
            "fused AdamW (give a torch.optim.AdamW, or set learning_rate, adam_beta1, "
            "adam_beta2, adam_epsilon and weight_decay)"
        )
    groups = optimizer.param_groups
    for name in _CARRIED:
        values = {repr(g[name]) for g in groups}
        if len(values) > 1:
            raise ValueError(
                f"optimizers: the optimizer's parameter groups differ in {name} "
                f"({', '.join(sorted(values))}); nostall's AdamW has one setting for all"
            )
    for name, default in _REFUSED.items():
        if groups[0].get(name, default) != default:
            raise ValueError(f"optimizers: {name}={groups[0][name]!r} is not supported")
    if groups[0]["weight_decay"] and not groups[0].get("decoupled_weight_decay", False):
        raise ValueError(
            "optimizers: Adam's weight_decay is an L2 term in the gradient; nostall's decay "
            "is AdamW's (decoupled): give a torch.optim.AdamW"
        )
    if optimizer.state:
        raise ValueError(
            "optimizers: the optimizer has already stepped; nostall starts its own moments "
            "(resume a run with train(resume_from_checkpoint=...))"
        )
    if peft_config is not None:
        raise ValueError(
            "optimizers: with peft_config the trained parameters are the adapters nostall "
            "adds; give the optimizer's settings as learning_rate, adam_* and weight_decay"
        )
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"optimizers: give the model object the optimizer was built over (model is {model!r})"
        )
    held = {id(p) for g in groups for p in g["params"]}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    if held != trainable:
        raise ValueError(
            f"optimizers: the optimizer holds {len(held)} tensors and the model has "
            f"{len(trainable)} trainable parameters, {len(held & trainable)} in both; build it "
            "over model.parameters()"
        )


def _check_scheduler(scheduler, optimizer) -> None:
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ValueError(
            "optimizers: ReduceLROnPlateau steps on a metric the trainer does not give it; "
            "use a schedule of steps (LambdaLR, a transformers get_*_schedule) or "
            "lr_scheduler_type"
        )
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise ValueError(f"optimizers: {type(scheduler).__name__} is not a torch LRScheduler")
    if scheduler.optimizer is not optimizer:
        raise ValueError("optimizers: the lr_scheduler was built over another optimizer")
