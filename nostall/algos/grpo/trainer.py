"""GRPOTrainer: a GRPO run as the shared training loop's hooks, with TRL's constructor.

    from nostall import GRPOConfig, GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(8 - len(c)) for c in completions]

    trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, train_dataset=rows,
                          args=GRPOConfig(output_dir="runs/grpo", steps=100))
    result = trainer.train()      # GRPOResult; the model is saved in output_dir/model

`model` is a built-in name, a local directory or a `transformers` causal LM (its tokenizer as
`processing_class`, or found beside it); `reward_funcs` callables with TRL's signature
`fn(prompts, completions, **kwargs) -> list[float]` or "module:function" strings; `train_dataset`
a `datasets.Dataset`, a list of dicts or a path, each row with a `prompt` and any columns the
rewards read. The `nostall train grpo` command builds the same trainer from its flags.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from nostall.algos.grpo.config import RESUMABLE, GRPOConfig
from nostall.algos.grpo.result import GRPOResult
from nostall.algos.grpo.run_evaluations import RunEvaluations
from nostall.algos.grpo.setup import Setup, build
from nostall.algos.grpo.state import restore, save_model, snapshot
from nostall.algos.grpo.trl_inputs import reward_models, trainer_inputs, trainer_tools
from nostall.algos.grpo.trl_surface import (
    STATE_FILE,
    TRLRun,
    last_checkpoint,
    lora_settings,
    resume_path,
)
from nostall.algos.grpo.trl_surface import folder as trl_folder
from nostall.algos.grpo.update import UpdateContext, grpo_update
from nostall.algos.grpo.user_optimizer import take_optimizers
from nostall.runtime.heap import frozen_heap
from nostall.train import checkpoint, loop
from nostall.train.hooks import WritesOutputs
from nostall.train.log_window import LogWindow
from nostall.train.loop import Clock, LogFn, logs_at
from nostall.train.outputs import write_outputs
from nostall.train.reporters import Reporters, requested


class GRPOTrainer(WritesOutputs):
    algorithm = "grpo"

    def __init__(
        self,
        model=None,
        reward_funcs=None,
        args: GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        tools=None,
        environment_factory=None,
        *,
        setup: Setup | None = None,
    ):
        """TRL's arguments, in TRL's order (see the module's docstring); `setup` when the
        caller built the run already (nostall.algos.grpo.setup.build)."""
        args = GRPOConfig() if args is None else args
        self.args = args  # (as TRL's trainer.args: the config given)
        if args.eval_strategy != "no" and eval_dataset is None:
            raise ValueError(f"eval_strategy={args.eval_strategy!r} needs an eval_dataset")
        if peft_config is not None:
            lora = lora_settings(peft_config)
            args.lora_r, args.lora_alpha = lora["lora_r"], lora["lora_alpha"]
            args.lora_target_modules = lora["target"]
        reward_funcs = reward_models(reward_funcs, reward_processing_classes)
        inputs = self._inputs = trainer_inputs(
            args, model, reward_funcs, train_dataset, processing_class
        )
        trainer_tools(args, inputs, tools, environment_factory)
        # (a user's AdamW: its settings are the run's; its scheduler sets the rate)
        self._schedule = take_optimizers(optimizers, model, peft_config, args)
        args.check()
        torch.set_num_threads(args.torch_threads)
        self.setup = setup or build(args, inputs)
        # The run's settings as resolved (a default completion length cut to the model's
        # context is the copy's; the config given is left as it was).
        self.config = args = self.setup.args
        self.transport = self.setup.loop
        self.model = self.setup.lm.model
        self.processing_class = self.setup.lm.tokenizer
        self.eval_dataset = eval_dataset
        self.published_model = self.setup.compute  # (bf16 compute: the copy generation reads)
        self._update_context = UpdateContext(
            self.setup.decoder,
            self.setup.stepper,
            args,
            self.setup.vocab,
            self.setup.group_index,
            self.setup.reference,
            self.setup.lm.eos_token_id,
            self.setup.writing,
        )
        self.result = GRPOResult(self.algorithm, asdict(args))
        self.first_step, self.last_step = 1, args.steps
        self._offset = 0.0  # seconds of the run before a resume
        # Running sums (count, version lags, per-token version lags): a run keeps nothing per
        # step for its mean lags.
        self._lag_sums = [0, 0.0, 0.0]
        self._new_tokens = 0
        self._stats: dict[str, list[float]] = {}  # TRL's batch figures since the last log
        # The update's figures since the last log (grad_norm: the logged step's, as
        # transformers')
        self._window = LogWindow(last_only=("grad_norm",))
        self.result.reward_functions = list(self.setup.reward_names)
        self.result.dataset = self.setup.dataset
        self.result.compute_dtype = _dtype_name(self.setup.decoder.output_weight)
        self.result.master_dtype = _dtype_name(self.setup.optimizer.flat_parameters)
        self.report: str | None = None  # the report's text, once written
        self.trl = TRLRun(self, callbacks)
        self._logged_step = 0  # the step of the last log line
        self.evaluations = RunEvaluations(self)
        if args.resume:
            self._resume(args.resume)
        self.trl.event("on_init_end")

    def _resume(self, path: str) -> None:
        """The run's state from the checkpoint at `path`: it goes on from the step after."""
        args = self.config
        saved_args, state = checkpoint.load(path, self.algorithm)
        saved_args.setdefault("entropy_coef", 0.0)  # saved before the bonus existed: none
        if saved_args.get("micro_batch_size") is not None:  # (its earlier name)
            saved_args["per_device_train_batch_size"] = saved_args.pop("micro_batch_size")
        for name, default in asdict(type(args)()).items():  # saved before a setting existed:
            saved_args.setdefault(name, default)  # it trained as the default
        checkpoint.check_compatible(saved_args, asdict(args), RESUMABLE)
        checkpoint.check_finite(state["model"], path)
        self._resume_schedule(state, path)
        saved_step = restore(self.setup, state, self.result)
        self.result.checkpoints = checkpoint.lineage(state, path)
        if args.steps <= saved_step:
            raise ValueError(
                f"--steps {args.steps} is not past the checkpoint's step "
                f"{saved_step}: nothing would be trained (give --steps above "
                f"{saved_step})"
            )
        self.first_step = saved_step + 1
        self._logged_step = saved_step
        self.result.find_target(args.target_reward)
        steps = self.result.step_times
        self._offset = steps[-1] if steps else 0.0
        self.trl.resumed(state, saved_step, path)
        window = state.get("log_window", {})  # (none in a checkpoint from before the window)
        self._window.load_state_dict(window.get("update", {}))
        self._stats = {name: list(values) for name, values in window.get("batches", {}).items()}
        self._logged_step = int(window.get("logged_step", saved_step))
        # An evaluation of the checkpoint's step that was running: run again on its weights
        self.evaluations.pending = state.get("pending_eval")

    def _resume_schedule(self, state: dict, path: str) -> None:
        saved = state.get("lr_scheduler")
        if (saved is None) != (self._schedule is None):
            given = "was" if saved is not None else "was not"
            raise ValueError(
                f"optimizers: the run of the checkpoint {path} {given} given an lr_scheduler; "
                "resume it as it was started (the same optimizers=), or its rates would differ"
            )
        if saved is not None:
            self._schedule.load_state_dict(saved)

    # What a run leaves in its output_dir.
    outputs = (
        "report",
        "learning_curve.png",
        "timeline.png",
        "tensorboard/",
        "model/ for from_pretrained",
    )

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        *,
        log: LogFn | None = None,
        time_limit_s: float | None = None,
    ) -> GRPOResult:
        """Runs the loop, calling log(step, metrics) every log_interval steps (stopping at the
        first log past `time_limit_s` seconds, when given); with an output_dir, writes the
        model and the report there (`self.report`: its text). `resume_from_checkpoint`, as
        TRL's: True resumes from output_dir's last checkpoint-N folder, a folder or file
        from that one."""
        if resume_from_checkpoint:
            if resume_from_checkpoint is True:
                path = last_checkpoint(self.config.output_dir)
            else:
                path = resume_path(resume_from_checkpoint)
            self._resume(path)
        self.trl.begin(self.first_step)
        args = self.config
        names = requested(args.report_to)
        if log is not None or not args.output_dir:
            # (the caller's own logger: the command's writes TensorBoard itself; and a run with
            # no output_dir writes no files, TensorBoard's included)
            names = [n for n in names if n != "tensorboard"]
        run_name = args.run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        reporters = Reporters(names, args.output_dir, run_name, asdict(args))
        try:
            with self.evaluations.during(reporters):
                result = loop.run(self, reporters.joined(log), time_limit_s)
        finally:
            reporters.close()
        self.trl.summary(result.seconds, self.first_step)
        self.trl.event("on_train_end")
        return result

    @property
    def state(self):
        """transformers' TrainerState of the run (global_step, epoch, log_history), as TRL's."""
        return self.trl.state

    def save_model(self, out_dir) -> None:
        """The trained model and its tokenizer, loadable with transformers' from_pretrained."""
        save_model(self.setup, out_dir)

    def write_outputs(self, out_dir: Path) -> str:
        """model/ (transformers' from_pretrained), the report and its plots."""
        self.save_model(out_dir / "model")
        args = self.config
        subject = f"{args.dataset or args.task} ({args.model})"
        self.report = write_outputs(self.result, out_dir, subject)
        return self.report

    def progress_span(self) -> tuple[int, str, int]:
        """(total, unit, already done) of the run's progress, in steps."""
        return self.last_step, "step", self.first_step - 1

    # -- the loop's hooks (nostall.train.loop.Hooks) --------------------------------------------
    def running(self):
        stack = contextlib.ExitStack()
        stack.enter_context(frozen_heap())
        # (A rollout process is ready when the loop's block begins: the clock starts after it.)
        stack.enter_context(self.transport)
        if self.setup.ranks is not None:  # (on the cluster the transport brought up)
            stack.enter_context(self.setup.ranks)
        return stack

    def begin_step(self, step: int) -> None:
        # The schedule's rate for this batch (host arithmetic: nothing waits).
        if self._schedule is not None:  # (optimizers=: the user's scheduler)
            rate = self._schedule.rate_at((step - 1) * self.trl.per_batch)
        else:
            rate = self.config.learning_rate_at(step)
        self.setup.optimizer.param_groups[0]["lr"] = rate
        self.trl.event("on_step_begin")

    def saves(self, step: int) -> bool:
        folder_due = self.trl.step_end(step)  # (TRL's on_step_end, its save schedule)
        args = self.config
        if args.checkpoint:
            return step % args.checkpoint_every == 0 or step == self.last_step
        return folder_due

    def saved(self, step: int, path: str) -> None:
        if self.trl.folders:
            self.result.checkpoints = self.trl.saved(path)
        elif self.config.save_total_limit:
            self.result.checkpoints, _ = checkpoint.prune(
                self.result.checkpoints, self.config.save_total_limit
            )

    def after_log(self, step: int) -> None:
        self.evaluations.after_step(step)

    def end_step(self, step: int) -> bool:
        return self.trl.stops()

    def evaluate(self, eval_dataset=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """TRL's evaluate: every prompt of `eval_dataset` (default: the trainer's) once, with
        num_generations_eval completions each from the model as it is; TRL's figures under
        `metric_key_prefix`_ names, and pass@1, logged into log_history and given to the
        callbacks' on_log and on_evaluate."""
        metrics = self.evaluations.figures(
            self.setup.compute, eval_dataset, prefix=metric_key_prefix
        )
        self.trl.log_eval(metrics)
        return metrics

    def device_tensors(self, batch):
        return [*batch.tensors().values(), *self.setup.device_tensors()]

    def update(self, batch, step: int) -> dict[str, torch.Tensor]:
        setup = self.setup
        # TRL's further figures (grad_norm, entropy, clip ratios): on every step with
        # measure_every_step (TRL's), else on the steps that log alone
        logging = logs_at(step, self.config, self.last_step)
        measure = logging or self.config.measure_every_step
        if setup.ranks is not None:
            metrics = setup.ranks.update(batch, setup.optimizer.param_groups[0]["lr"], measure)
        else:
            metrics = grpo_update(self._update_context, batch, setup.corrects, measure)
        self._window.add(metrics)
        # (a logged step's figures: their means over the window, as TRL logs them)
        return self._window.means() if logging else metrics

    def record(self, batch, lag: int, logging: bool) -> None:
        sums = self._lag_sums
        sums[0] += 1
        sums[1] += lag
        sums[2] += batch.mean_token_lag(self.transport.version)
        self.result.rewards.append(batch.reward_mean)  # (host values: no sync)
        self.result.tokens += batch.tokens
        self.trl.num_tokens += batch.prompt_tokens + batch.tokens
        self._new_tokens += batch.tokens
        for name, value in batch.stats.items():
            self._stats.setdefault(name, []).append(value)
        timeline = self.transport.timeline
        if batch.weight_push:  # timed where the engine runs: by the wall clock
            timeline.record_wall("push", *batch.weight_push)
        for side, start, end in batch.episode_spans:  # (decode rounds, tool calls, idle waits)
            timeline.record_wall(side, start, end)
        if logging and batch.samples:  # log_completions: the logged step's texts
            out_dir = Path(self.config.output_dir)
            out_dir.mkdir(parents=True, exist_ok=True)  # (the run's other outputs come later)
            with open(out_dir / "completions.jsonl", "a") as f:
                for row in batch.samples:
                    f.write(json.dumps({"step": len(self.result.rewards), **row}) + "\n")

    def publishes(self, step: int) -> bool:
        return True

    def at_boundary(self, step: int, clock: Clock) -> None:
        # Step times count from the original run's start.
        self.result.step_times.append(time.perf_counter() - (clock.ready - self._offset))
        self.result.note_target(self.config.target_reward)

    def snapshot(self, step: int) -> dict:
        pending = self.evaluations.at_checkpoint(step)  # (before the log_history is taken)
        if self.setup.ranks is not None:  # the optimizer's state, whole, from the ranks
            self.setup.ranks.sync_optimizer()
        state = {**snapshot(self.setup, step, self.result), "trl": self.trl.snapshot()}
        state["pending_eval"] = pending
        # The open logging window (a step between two log lines): the resumed run's next log
        # line averages the same steps
        state["log_window"] = {
            "update": self._window.state_dict(),
            "batches": dict(self._stats),
            "logged_step": self._logged_step,
        }
        if self._schedule is not None:
            state["lr_scheduler"] = self._schedule.state_dict()
        return state

    def checkpoint_path(self, step: int) -> str:
        if self.trl.folders:
            global_step = step * self.trl.per_batch
            return str(trl_folder(self.config.output_dir, global_step) / STATE_FILE)
        return self.config.checkpoint.format(step=step)

    def log_values(self, step: int, values: dict[str, float], lag: int, clock: Clock):
        recent = self.result.rewards[-10:]
        values.update(
            reward=sum(recent) / len(recent),
            version_lag=float(lag),
            tokens_per_second=self._new_tokens / (time.perf_counter() - clock.ready),
            learning_rate=float(self.setup.optimizer.param_groups[0]["lr"]),
        )
        # TRL's figures, each the mean over the batches since the last log.
        values.update({name: _nanmean(v) for name, v in self._stats.items()})
        self._stats.clear()
        # TRL's "reward": the mean over the batches since the last log (the bar's is the last
        # ten's)
        since = self.result.rewards[-(step - self._logged_step) :]
        self._logged_step = step
        seconds = self.result.step_times[-1]  # (into the run, its time before a resume too)
        self.trl.log({**values, "reward": sum(since) / len(since)}, step, seconds)
        return step, values

    def solved(self) -> bool:
        return self.result.steps_to_target is not None

    def interrupted(self) -> None:
        """The model as it is (the last completed update's), when the run has an output_dir."""
        if self.config.output_dir:
            self.save_model(Path(self.config.output_dir) / "model")

    def finish(self, clock: Clock, end: float) -> GRPOResult:
        result = self.result
        result.seconds = end - clock.ready
        stats = self.transport.stats  # the generation side's figures
        result.syncs_per_decode_step = stats.get("syncs_per_decode_step")
        result.sync_sites += stats.get("sync_sites", [])
        count, lags, token_lags = self._lag_sums
        result.mean_lag = lags / count if count else None
        result.mean_token_lag = token_lags / count if count else None
        result.weight_swaps = stats.get("swaps", 0)
        result.weight_pushes = stats.get("weight_pushes", 0)
        result.weight_push_ms = stats.get("weight_push_ms")
        result.generation_ms = result.side_ms("rollout")
        result.update_ms = result.side_ms("train")
        return result


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _nanmean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def train(
    args: GRPOConfig,
    log: LogFn | None = None,
    setup: Setup | None = None,
    time_limit_s: float | None = None,
) -> GRPOResult:
    """`GRPOTrainer(args=args, setup=setup).train(log, time_limit_s)`."""
    return GRPOTrainer(args=args, setup=setup).train(log=log, time_limit_s=time_limit_s)
