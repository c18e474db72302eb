"""A GRPO run's evaluations, as TRL's trainer makes them: `evaluate()` on demand, and
eval_strategy's after the steps it names, each logged into log_history (with the global step
and epoch it evaluated), given to the callbacks' on_log and on_evaluate, and sent to the run's
reporters. eval_strategy's run beside training (overlapped_eval.py) unless eval_overlap=False
or the model trains on ranks (its weights are theirs): then between two steps, on the
trainer's thread. A checkpoint taken while the evaluation of its own step runs names it; the
run resumed from it evaluates the same weights again."""

from __future__ import annotations

import contextlib

from nostall.algos.grpo.evaluation import EvalSettings, evaluate_model
from nostall.algos.grpo.generation import prompt_rewards
from nostall.algos.grpo.overlapped_eval import OverlappedEval
from nostall.lm.models import LanguageModel


class RunEvaluations:
    """The evaluations of `trainer` (a GRPOTrainer: its setup, config, inputs, eval_dataset
    and TRL surface)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.reporters = None  # (the run's, while train runs)
        self.pending: tuple | None = None  # (a checkpoint's: run first when resumed)
        self.beside = OverlappedEval(
            lambda model, cancelled: self.figures(model, cancelled=cancelled),
            lambda metrics, asked: self.log(metrics, asked[0], asked[1:]),
        )

    def figures(
        self, model, eval_dataset=None, cancelled=None, prefix: str = "eval"
    ) -> dict | None:
        """TRL's eval figures of `model` (the compute weights, or a copy of them) on
        `eval_dataset` (default: the trainer's), under `prefix`_ names; None once
        `cancelled`."""
        trainer = self.trainer
        rows = trainer.eval_dataset if eval_dataset is None else eval_dataset
        if rows is None:
            raise ValueError("evaluate: no eval_dataset (give one here or to the trainer)")
        args, lm = trainer.config, trainer.setup.lm
        settings = EvalSettings(
            num_generations=args.num_generations_eval or args.num_generations,
            batch_size=args.per_device_eval_batch_size,
        )
        rewards = prompt_rewards(args, trainer._inputs)  # (its own: the rollout side's is busy)
        evaluated = LanguageModel(model, lm.tokenizer, lm.name)
        figures = evaluate_model(
            evaluated, rows, rewards, args, settings, cancelled, trainer._inputs
        )
        if figures is None:
            return None
        return {f"{prefix}_{name}": value for name, value in figures.items()}

    def log(self, metrics: dict, step: int, evaluated: tuple | None = None) -> None:
        """An evaluation's figures into log_history and the callbacks (with the (global step,
        epoch) it evaluated, default now's), and to the run's reporters under `step`."""
        self.trainer.trl.log_eval(metrics, evaluated)
        if self.reporters is not None:
            self.reporters.evaluation(step, metrics)

    def after_step(self, step: int) -> None:
        """eval_strategy's evaluation after `step`, where it asks for one; and the one beside
        training that has finished since, logged."""
        trainer = self.trainer
        self.beside.poll()
        if not trainer.trl.evaluates(step):
            return
        compute = trainer.setup.compute
        if trainer.config.eval_overlap and trainer.setup.ranks is None:
            state = trainer.trl.state
            self.beside.start(compute, (step, state.global_step, state.epoch))
        else:
            self.log(self.figures(compute), step)

    def at_checkpoint(self, step: int) -> tuple | None:
        """Before a checkpoint of `step`: the evaluation of an earlier step is waited for (the
        checkpoint's log_history holds it); one of this step's, still running, is returned for
        the checkpoint to name."""
        asked = self.beside.asked
        if asked is not None and asked[0] == step:
            return asked
        self.beside.wait()
        return None

    @contextlib.contextmanager
    def during(self, reporters):
        """Around the training loop: a resumed checkpoint's evaluation started on its
        restored weights; at the end the last one running logged, and on an error cancelled
        (its thread joined either way)."""
        self.reporters = reporters
        try:
            if self.pending is not None:
                self.beside.start(self.trainer.setup.compute, tuple(self.pending))
                self.pending = None
            yield
            self.beside.wait()
        finally:
            self.beside.close()
            self.reporters = None
