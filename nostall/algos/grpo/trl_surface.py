"""What GRPOTrainer shows a script written for TRL besides the run itself: transformers'
callbacks called at TRL's events with a `TrainerState` (global step, epoch, log_history), the
`checkpoint-N` folders TRL's `save_strategy` writes (each a model directory transformers loads,
with nostall's exact-resume state beside it) and how `resume_from_checkpoint=True` finds the
last of them, and a `peft.LoraConfig` read into the run's LoRA settings."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

from nostall import files

# Inside a checkpoint-N folder: nostall's resume state (beside transformers' model files).
STATE_FILE = "nostall_state.pt"
_FOLDER = re.compile(r"^checkpoint-(\d+)$")


class Callbacks:
    """transformers' TrainerCallbacks (objects or classes), called at TRL's events with the
    run's TrainerState and TrainerControl; a callback's returned control replaces the run's,
    as transformers' CallbackHandler does."""

    def __init__(self, callbacks, args, objects: dict):
        from transformers import TrainerControl, TrainerState

        self.callbacks = [c() if isinstance(c, type) else c for c in callbacks or []]
        self.args, self.objects = args, objects
        self.state, self.control = TrainerState(), TrainerControl()

    def __call__(self, event: str, **kwargs) -> None:
        for callback in self.callbacks:
            returned = getattr(callback, event)(
                self.args, self.state, self.control, **self.objects, **kwargs
            )
            if returned is not None:
                self.control = returned


def folder(output_dir: str, global_step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{global_step}"


def last_checkpoint(output_dir: str) -> str:
    """The resume state of output_dir's checkpoint-N with the highest N (TRL's
    get_last_checkpoint); ValueError naming the folder where there is none."""
    found = []
    if Path(output_dir).is_dir():
        for entry in Path(output_dir).iterdir():
            match = _FOLDER.match(entry.name)
            if match and (entry / STATE_FILE).is_file():
                found.append((int(match.group(1)), entry))
    if not found:
        raise ValueError(
            f"resume_from_checkpoint=True: {output_dir} holds no checkpoint-N folder with "
            f"{STATE_FILE} (give the folder or file to resume from)"
        )
    return str(max(found)[1] / STATE_FILE)


def resume_path(given) -> str:
    """A checkpoint-N folder given to resume_from_checkpoint: its state file; a file: itself."""
    path = Path(given)
    return str(path / STATE_FILE) if path.is_dir() else str(path)


def write_trainer_state(state, out: Path) -> None:
    """trainer_state.json, as transformers writes it (its keys; read by TRL's tools)."""
    text = json.dumps(_state_dict(state), indent=2, sort_keys=True) + "\n"
    with files.replaced(out / "trainer_state.json") as f:
        f.write(text.encode())


def _state_dict(state) -> dict:
    import dataclasses

    return {
        k: v
        for k, v in dataclasses.asdict(state).items()
        if k not in ("stateful_callbacks",) and _json_safe(v)
    }


def _json_safe(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def prune_folders(written: list[str], keep: int, output_dir: str) -> list[str]:
    """Deletes all but the `keep` newest checkpoint-N folders this run wrote (`written`, their
    state files, oldest first); a folder is removed only if it is a checkpoint-N folder of
    `output_dir` holding a state file (a lineage read from a checkpoint cannot have another
    folder removed)."""
    home = Path(output_dir).resolve()
    kept, old = written[-keep:], written[:-keep]
    for state in old:
        where = Path(state).parent
        ours = _FOLDER.match(where.name) and where.resolve().parent == home
        if state not in kept and ours and Path(state).is_file():
            shutil.rmtree(where)
    return kept


def lora_settings(peft_config) -> dict:
    """A peft.LoraConfig as the run's LoRA settings (lora_r, lora_alpha, the modules);
    ValueError naming what nostall's adapters cannot take."""
    if not hasattr(peft_config, "r") or not hasattr(peft_config, "lora_alpha"):
        raise ValueError(
            f"peft_config: {type(peft_config).__name__} is not a peft.LoraConfig (nostall "
            "trains LoRA adapters only)"
        )
    bias = getattr(peft_config, "bias", "none")
    if bias != "none":
        raise ValueError(f"peft_config: bias={bias!r}; nostall's adapters train no biases")
    for name in ("use_dora", "use_rslora"):
        if getattr(peft_config, name, False):
            raise ValueError(f"peft_config: {name}=True is not supported; plain LoRA is")
    modules = peft_config.target_modules
    if modules is None or modules == "all-linear":
        target = "all-linear"
    elif isinstance(modules, str):
        raise ValueError(
            f"peft_config: target_modules={modules!r} as a pattern is not supported; give "
            "module names or 'all-linear'"
        )
    else:
        target = ",".join(sorted(modules))
    return {"lora_r": peft_config.r, "lora_alpha": float(peft_config.lora_alpha), "target": target}


class TRLRun:
    """A GRPO run as TRL's trainer shows it: global steps (optimizer steps), epochs, the
    TrainerState's log_history, callbacks at TRL's events, and the checkpoint-N folders of
    save_strategy. The trainer calls it from its loop hooks."""

    def __init__(self, trainer, callbacks):
        args, setup = trainer.config, trainer.setup
        self.trainer, self.args = trainer, args
        self.per_batch = args.optimizer_steps_per_batch
        rows = setup.prompt_rows or None
        self.per_epoch = args.steps_per_epoch(rows)
        # checkpoint-N folders, unless nostall's own --checkpoint files were asked for
        self.folders = args.save_strategy != "no" and not args.checkpoint and args.output_dir
        self.written: list[str] = []  # this run's checkpoint folders' state files, oldest first
        self.num_tokens = 0  # prompt and completion tokens trained on (TRL's num_tokens)
        self.losses = [0.0, 0]  # the logged losses' sum and count (for train_loss)
        self.last_log = (0, 0.0)  # (step, seconds into the run) of the last log line
        objects = {"model": trainer.model, "processing_class": trainer.processing_class}
        self.callbacks = Callbacks(callbacks, trainer.args, objects)
        state = self.callbacks.state
        state.max_steps = args.steps * self.per_batch
        state.num_train_epochs = math.ceil(args.steps / self.per_epoch) if self.per_epoch else 0
        state.logging_steps = args.log_interval * self.per_batch
        state.eval_steps = args.eval_steps or state.logging_steps
        state.save_steps = args.save_steps
        state.train_batch_size = args.per_device_train_batch_size or args.batch_size

    @property
    def state(self):
        return self.callbacks.state

    def event(self, name: str, **kwargs) -> None:
        self.callbacks(name, **kwargs)

    def epoch(self, step: int) -> float:
        return step / self.per_epoch if self.per_epoch else 0.0

    def begin(self, first_step: int) -> None:
        """on_train_begin; ValueError, before anything is written, where this run's
        checkpoint folders would go over another run's (output_dir holding checkpoint-N
        folders this run's lineage did not write)."""
        if self.folders:
            ours = {str(Path(p).parent) for p in self.written}
            theirs = [
                entry.name
                for entry in sorted(Path(self.args.output_dir).glob("checkpoint-*"))
                if _FOLDER.match(entry.name) and str(entry) not in ours
            ]
            if theirs:
                raise ValueError(
                    f"output_dir {self.args.output_dir} holds another run's checkpoint folders "
                    f"({', '.join(theirs[:3])}{', ...' if len(theirs) > 3 else ''}); give "
                    "another output_dir, resume with train(resume_from_checkpoint=True), or "
                    "remove them"
                )
        self.state.global_step = (first_step - 1) * self.per_batch
        self.state.epoch = self.epoch(first_step - 1)
        self.event("on_train_begin")

    def step_end(self, step: int) -> bool:
        """on_step_end at this generation batch's last optimizer step; whether TRL would save
        a checkpoint folder now (its schedule, or a callback's should_save)."""
        state = self.state
        state.global_step, state.epoch = step * self.per_batch, self.epoch(step)
        self.event("on_step_end")
        if not self.folders:
            return False
        args = self.args
        if args.save_strategy == "steps":
            scheduled = state.global_step % args.save_steps < self.per_batch
        else:  # "epoch"
            scheduled = bool(self.per_epoch) and step % self.per_epoch == 0
        last = step == self.trainer.last_step  # (TRL saves at the end too)
        return scheduled or last or self.callbacks.control.should_save

    def saved(self, path: str) -> list[str]:
        """After a checkpoint's state file is written into its folder: the model and
        trainer_state.json beside it, older folders past save_total_limit removed,
        on_save called. Returns the folders' state files kept."""
        out = Path(path).parent
        # The model is written beside the folder and renamed into place: the state file
        # already in it is moved aside, and back once the model is whole.
        aside = out.with_name(f".{out.name}.{STATE_FILE}")
        os.replace(path, aside)
        self.trainer.save_model(out)
        os.replace(aside, path)
        write_trainer_state(self.state, out)
        self.written = [p for p in self.written if p != path] + [path]
        if self.args.save_total_limit:
            limit = self.args.save_total_limit
            self.written = prune_folders(self.written, limit, self.args.output_dir)
        self.callbacks.control.should_save = False
        self.event("on_save")
        return self.written

    def log(self, values: dict, step: int, seconds: float) -> None:
        """A log line into log_history with TRL's keys, epoch and step; on_log. `seconds`: the
        run's time at this step's end."""
        last_step, last_seconds = self.last_log
        self.last_log = (step, seconds)
        values = {
            **values,
            "num_tokens": float(self.num_tokens),
            "step_time": (seconds - last_seconds) / max(1, step - last_step),
        }
        self.losses = [self.losses[0] + values.get("loss", 0.0), self.losses[1] + 1]
        entry = {**values, "epoch": round(self.state.epoch, 4), "step": self.state.global_step}
        self.state.log_history.append(entry)
        self.event("on_log", logs=dict(values))

    def evaluates(self, step: int) -> bool:
        """Whether eval_strategy evaluates after this step (TRL's: every eval_steps optimizer
        steps, default logging_steps; or at each epoch's end)."""
        args = self.args
        if args.eval_strategy == "steps":
            every = args.eval_steps or args.log_interval * self.per_batch
            return self.state.global_step % every < self.per_batch
        if args.eval_strategy == "epoch":
            return bool(self.per_epoch) and step % self.per_epoch == 0
        return False

    def log_eval(self, metrics: dict, evaluated: tuple[int, float] | None = None) -> None:
        """An evaluation's figures into log_history with the (global step, epoch) it evaluated
        (default: now's), then on_log and on_evaluate, as transformers' evaluate calls them."""
        step, epoch = evaluated or (self.state.global_step, self.state.epoch)
        entry = {**metrics, "epoch": round(epoch, 4), "step": step}
        self.state.log_history.append(entry)
        self.event("on_log", logs=dict(metrics))
        self.event("on_evaluate", metrics=dict(metrics))

    def summary(self, seconds: float, first_step: int) -> None:
        """TRL's last log line: the run's time, samples and steps a second, the mean loss."""
        steps = self.state.global_step - (first_step - 1) * self.per_batch
        args = self.args
        micro = args.per_device_train_batch_size or args.batch_size // args.micro_batches
        samples = steps * micro * args.gradient_accumulation_steps  # (as transformers counts)
        total, count = self.losses
        entry = {
            "train_runtime": seconds,
            "train_samples_per_second": samples / seconds if seconds else 0.0,
            "train_steps_per_second": steps / seconds if seconds else 0.0,
            "train_loss": total / count if count else 0.0,
            "epoch": round(self.state.epoch, 4),
            "step": self.state.global_step,
        }
        self.state.log_history.append(entry)

    def stops(self) -> bool:
        return bool(self.callbacks.control.should_training_stop)

    def snapshot(self) -> dict:
        return {
            "log_history": list(self.state.log_history),
            "folders": list(self.written),
            "num_tokens": self.num_tokens,
            "losses": list(self.losses),
        }

    def resumed(self, state: dict, step: int, path: str) -> None:
        """The run's TRL state from the checkpoint at `path` (its folders: those it lists, and
        its own, written after its state was taken)."""
        saved = state.get("trl", {})
        self.state.log_history = list(saved.get("log_history", []))
        self.written = [p for p in saved.get("folders", []) if isinstance(p, str)]
        if Path(path).name == STATE_FILE and path not in self.written:
            self.written.append(path)
        self.num_tokens = int(saved.get("num_tokens", 0))
        self.losses = [float(v) for v in saved.get("losses", [0.0, 0])]
        self.state.global_step, self.state.epoch = step * self.per_batch, self.epoch(step)
