"""The transformers TrainingArguments a GRPO run honours (TRL's GRPOConfig extends them): the
run's length in optimizer steps or epochs, the optimizer, precision switches, checkpoint
folders, evaluation, where logs go; with TRL's defaults. GRPOConfig (config.py) extends this
with GRPO's settings; every run's (device, transport, checkpoints) come from RunConfig. TRL's
names that are not fields anywhere are taken here as trl_names.py says."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from nostall.algos.grpo import trl_names
from nostall.train.run_config import RunConfig

# What a resume may change of these: the run's length, its checkpoints, its evaluations and
# logs (every other setting must match the checkpoint's).
TRAINING_RESUMABLE = {
    "max_steps",
    "num_train_epochs",
    "save_strategy",
    "save_steps",
    "eval_strategy",
    "eval_steps",
    "eval_overlap",
    "report_to",
    "run_name",
    "measure_every_step",
}


@dataclass
class TrainingArgs(RunConfig):
    """transformers' training arguments, as TRL's GRPO reads them"""

    outside_names = trl_names.OUTSIDE_NAMES

    def set_given(self, **values) -> None:
        """Settings as the user's own (an optimizer object's): the model-dependent defaults
        (GRPOConfig.resolve_defaults, run again once the model is known) leave them."""
        defaulted = self.__dict__.get("_defaulted", set())
        for name, value in values.items():
            setattr(self, name, value)
            defaulted.discard(name)

    seed: int = 42
    """seeds the run: the model's initialisation, the prompts' order and every sampling
    generator (TRL's default, 42; the command's, 0)"""
    max_steps: int = -1
    """optimizer steps to train for (TRL's; -1: num_train_epochs passes over the dataset)"""
    num_train_epochs: float = 3.0
    """passes over the dataset when neither steps nor max_steps is given (TRL's: the last
    generation batch that does not fill is left out of each epoch's count)"""
    optim: str = "adamw_torch_fused"
    """the optimizer: transformers' AdamW names ("adamw_torch_fused", "adamw_torch") are
    nostall's fused Adam with decoupled weight decay; others are refused"""
    adam_beta1: float = 0.9
    """Adam's first-moment decay"""
    adam_beta2: float = 0.999
    """Adam's second-moment decay"""
    adam_epsilon: float = 1e-8
    """Adam's epsilon"""
    bf16: bool | None = None
    """TRL's: True computes in bfloat16 (dtype="bfloat16"), False in float32; None: dtype"""
    fp16: bool = False
    """TRL's float16 compute: refused (bf16=True computes in bfloat16)"""
    use_cpu: bool = False
    """TRL's: True trains on the CPU (device="cpu")"""
    save_strategy: str = "steps"
    """TRL's: "steps" saves output_dir/checkpoint-N (N the optimizer step) every save_steps
    and at the end, each a model directory transformers loads with nostall's resume state
    beside it; "epoch" after each epoch; "no" none (nostall's --checkpoint is separate)"""
    save_steps: int = 500
    """optimizer steps between checkpoint-N folders (save_strategy="steps")"""
    eval_strategy: str = "no"
    """TRL's: "steps" evaluates on the trainer's eval_dataset every eval_steps, "epoch" after
    each epoch, between two steps (the trainer's evaluate())"""
    eval_steps: int | None = None
    """optimizer steps between evaluations (default: logging_steps, as TRL's)"""
    per_device_eval_batch_size: int = 8
    """completions an evaluation generates at once"""
    eval_overlap: bool = True
    """nostall's: eval_strategy's evaluations run beside training, on a thread of their own
    over a copy of the weights of the step they follow (one model's memory more), logged once
    done; False evaluates between two steps on the trainer's thread (training waits)"""
    report_to: str | list[str] = "none"
    """where logs go besides the trainer's log_history: "tensorboard" (output_dir/
    tensorboard/), "none" (TRL's default; the command's: tensorboard)"""
    run_name: str | None = None
    """a name for the run in its logs (TRL's)"""
    data_seed: int | None = None
    """seeds the prompts' order (default: seed)"""
    measure_every_step: bool = True
    """nostall's: the figures that cost work of their own (the entropy without a bonus, the
    clip ratios) measured on every step, each logged as its mean over the logging window as
    TRL's are; False measures them on the logged steps alone (cheaper; the command's
    default). Every other figure is the window's mean either way, grad_norm the logged
    step's"""

    def take_outside(self, taken: dict) -> None:
        """TRL's names that are not fields here (trl_names.py): kept, each checked."""
        for name, value in taken.items():
            if name in trl_names.DEFAULT_ONLY:
                trl_names.take(name, value)
        self.__dict__["_outside"] = dict(taken)

    def __getattr__(self, name: str):
        # (Only reached for a name that is not a field: TRL's others read as set or default.)
        if name in trl_names.OUTSIDE_NAMES:
            return self.__dict__.get("_outside", {}).get(name, trl_names.outside_default(name))
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def steps_per_epoch(self, rows: int | None) -> int | None:
        """Generation batches in an epoch of `rows` prompts (TRL's count: a last batch that
        does not fill is left out); None for a built-in task, which has no epochs."""
        if not rows:
            return None
        return rows // self.num_prompts

    def with_steps(self, rows: int | None) -> TrainingArgs:
        """This config with `steps` resolved as TRL counts a run: max_steps optimizer steps,
        or num_train_epochs passes over `rows` prompts (ValueError where neither can be)."""
        if self.steps is not None:
            return self
        per_batch = self.optimizer_steps_per_batch
        if self.max_steps > 0:
            if self.max_steps % per_batch:
                raise ValueError(
                    f"--max-steps {self.max_steps} must be a multiple of the {per_batch} "
                    "optimizer steps each generation batch makes (num_iterations x "
                    "steps_per_generation / gradient_accumulation_steps)"
                )
            return dataclasses.replace(self, steps=self.max_steps // per_batch)
        per_epoch = self.steps_per_epoch(rows)
        if per_epoch is None:
            raise ValueError(
                "a built-in task has no epochs: give --max-steps (optimizer steps) or --steps"
            )
        if per_epoch == 0:
            raise ValueError(
                f"the dataset's {rows} prompts do not fill one generation batch of "
                f"{self.num_prompts}: give fewer prompts a batch, or --max-steps"
            )
        optimizer_steps = math.ceil(self.num_train_epochs * per_epoch * per_batch)
        return dataclasses.replace(self, steps=math.ceil(optimizer_steps / per_batch))
