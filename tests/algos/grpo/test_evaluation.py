"""GRPO's evaluation, as TRL's evaluate: every eval prompt once with num_generations_eval
completions, TRL's figures under eval_ names into log_history and on_evaluate, evaluation during
training on eval_strategy, and pass@k by the unbiased estimator, checked against counting every
k-subset."""

import itertools
import math
import threading

import pytest

from nostall.algos.grpo import GRPOConfig, GRPOTrainer
from nostall.algos.grpo.evaluation import pass_at_k
from nostall.algos.grpo.overlapped_eval import EvaluationFailed
from nostall.train import checkpoint
from tests.algos.test_python_api import copy_reward, copy_rows


@pytest.mark.parametrize(("n", "c", "k"), [(8, 0, 1), (8, 3, 1), (8, 3, 4), (5, 2, 5), (6, 5, 2)])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_solve(n, c, k):
    solves = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(solves, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def _trainer(tmp_path, reward=copy_reward, rows=None, eval_rows=None, callbacks=None, **given):
    args = GRPOConfig(
        **{"max_steps": 4, "save_strategy": "no", **given},
        output_dir=str(tmp_path),
        num_generations=4,
        per_device_train_batch_size=8,
        watch_syncs=False,
    )
    return GRPOTrainer(
        model="tiny",
        reward_funcs=reward,
        train_dataset=copy_rows(16) if rows is None else rows,
        eval_dataset=copy_rows(5, seed=1) if eval_rows is None else eval_rows,
        args=args,
        callbacks=callbacks,
    )


def test_evaluate_scores_every_prompt_and_logs_trls_eval_names(tmp_path):
    from transformers import TrainerCallback

    seen = []

    class Recorder(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            seen.append(metrics)

    trainer = _trainer(tmp_path, num_generations_eval=3, per_device_eval_batch_size=6)
    trainer.trl.callbacks.callbacks.append(Recorder())
    metrics = trainer.evaluate()
    # 5 prompts, 3 completions each, 2 prompts a batch: 3 batches, the last of one prompt
    for name in ("eval_reward", "eval_reward_std", "eval_rewards/copy_reward/mean", "eval_pass@1"):
        assert math.isfinite(metrics[name]), name
    assert 0 <= metrics["eval_pass@1"] <= 1
    assert metrics["eval_completions/max_length"] <= 5
    assert (
        seen == [metrics] and trainer.state.log_history[-1]["eval_reward"] == metrics["eval_reward"]
    )
    again = trainer.evaluate()  # the same model, the same seed: the same figures
    assert again["eval_reward"] == metrics["eval_reward"]


def test_eval_strategy_steps_evaluates_during_training(tmp_path):
    trainer = _trainer(tmp_path, eval_strategy="steps", eval_steps=2)
    trainer.train()
    evaluated = [e["step"] for e in trainer.state.log_history if "eval_reward" in e]
    assert evaluated == [2, 4]


def _evaluations(trainer) -> list[tuple[int, dict]]:
    """(step, figures but the clock's) of each evaluation in log_history, by step."""
    found = [e for e in trainer.state.log_history if "eval_reward" in e]
    return sorted((e["step"], {k: v for k, v in e.items() if k != "eval_runtime"}) for e in found)


def test_evaluations_beside_training_are_those_between_steps(tmp_path):
    """eval_overlap (the default) evaluates a copy of the step's weights on a thread of its
    own: the figures are those the trainer's thread computes between two steps (the same
    weights, the same seed: equal)."""
    runs = {}
    for overlap in (False, True):
        trainer = _trainer(
            tmp_path / str(overlap), eval_strategy="steps", eval_steps=2, eval_overlap=overlap
        )
        trainer.train()
        runs[overlap] = _evaluations(trainer)
    assert [step for step, _ in runs[True]] == [2, 4]
    assert runs[True] == runs[False]


def _rows(n: int, seed: int, split: str) -> list[dict]:
    return [{**row, "split": split} for row in copy_rows(n, seed)]


def _split_trainer(out, on_eval, **given):
    """A trainer on train and eval rows of their own, evaluating every 2 steps, whose reward
    calls on_eval() before scoring the eval rows' completions."""

    def reward(prompts, completions, split, **kwargs):
        if split[0] == "eval":
            on_eval()
        return copy_reward(prompts, completions, **kwargs)

    return _trainer(
        out,
        reward=reward,
        rows=_rows(16, 0, "train"),
        eval_rows=_rows(5, 1, "eval"),
        eval_strategy="steps",
        eval_steps=2,
        **given,
    )


def _waits_past(steps, step: int):
    """on_eval: wait until the trainer has ended `step` (TimeoutError where it never does)."""

    def wait():
        if not steps.wait_past(step):
            raise TimeoutError("training waited for the evaluation")

    return wait


class _Steps:
    """A callback telling the global steps the trainer has ended."""

    def __init__(self):
        from transformers import TrainerCallback

        self.ended = 0
        self.past: dict[int, threading.Event] = {}
        steps = self

        class Watch(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                steps.ended = state.global_step
                for step, event in steps.past.items():
                    if state.global_step > step:
                        event.set()

        self.callback = Watch()

    def wait_past(self, step: int) -> bool:
        event = self.past.setdefault(step, threading.Event())
        if self.ended > step:
            event.set()
        return event.wait(timeout=120)


def test_training_goes_on_while_an_evaluation_runs(tmp_path):
    """The evaluation after step 2 scores its completions only once the trainer has ended
    step 3: it finishes only if training went on beside it (between steps, it would wait for
    itself and fail). Its entry is logged after step 3's line, under step 2."""
    steps = _Steps()
    trainer = _split_trainer(
        tmp_path,
        _waits_past(steps, 3),
        callbacks=[steps.callback],
        logging_steps=1,
        max_steps=5,
    )
    trainer.train()
    history = trainer.state.log_history
    where = {
        ("eval" if "eval_reward" in e else "train", e["step"]): i for i, e in enumerate(history)
    }
    assert where[("eval", 2)] > where[("train", 3)]
    assert [step for step, _ in _evaluations(trainer)] == [2, 4]


def test_an_evaluation_running_at_a_checkpoint_is_run_again_by_the_resumed_run(tmp_path):
    """The checkpoint after step 2 is taken while the evaluation of step 2's weights runs (it
    waits for step 3): the checkpoint names it, and the run resumed from there (stopped after
    step 3) evaluates the same weights again: its evaluations are the uninterrupted run's."""

    def run(out, resume=False, stopping=None):
        steps = _Steps()
        callbacks = [steps.callback]
        if stopping is not None:
            callbacks.append(stop_after(stopping))
        trainer = _split_trainer(
            out,
            _waits_past(steps, 2),
            callbacks=callbacks,
            save_strategy="steps",
            save_steps=2,
        )
        trainer.train(resume_from_checkpoint=resume or None)
        return trainer

    whole = run(tmp_path / "whole")
    stopped = run(tmp_path / "resumed", stopping=3)
    _, state = checkpoint.load(tmp_path / "resumed" / "checkpoint-2" / "nostall_state.pt", "grpo")
    assert state["pending_eval"][:2] == (2, 2)  # (the step evaluated, its global step)
    assert [step for step, _ in _evaluations(stopped)] == [2]
    resumed = run(tmp_path / "resumed", resume=True)
    assert [step for step, _ in _evaluations(resumed)] == [2, 4]
    assert _evaluations(resumed) == _evaluations(whole)


def stop_after(step: int):
    """A callback that stops the run at the end of optimizer step `step`."""
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == step

    return Stop()


def test_a_failing_evaluation_beside_training_stops_the_run_with_its_cause(tmp_path):
    def fail():
        raise KeyError("no such column in the eval rows")

    trainer = _split_trainer(tmp_path, fail)
    with pytest.raises(EvaluationFailed, match="after step 2 failed: KeyError") as caught:
        trainer.train()
    assert isinstance(caught.value.__cause__, KeyError)
    assert not [t for t in threading.enumerate() if t.name.startswith("nostall-eval")]


def test_evaluation_without_an_eval_dataset_is_refused(tmp_path):
    with pytest.raises(ValueError, match="eval_strategy='steps' needs an eval_dataset"):
        GRPOTrainer(
            model="tiny",
            reward_funcs=copy_reward,
            train_dataset=copy_rows(8),
            args=GRPOConfig(output_dir=str(tmp_path), eval_strategy="steps", max_steps=2),
        )


def test_the_eval_command_reports_mean_reward_and_pass_at_k_of_a_run(tmp_path, capsys):
    import json

    from nostall import cli
    from nostall.algos.grpo import GRPOCommandConfig

    run = tmp_path / "run"
    args = GRPOCommandConfig(steps=2, num_prompts=2, num_generations=2, output_dir=str(run))
    GRPOTrainer(args=args, train_dataset=copy_rows(8)).train()
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in copy_rows(3, seed=2)))
    argv = ["eval", str(run), "--dataset", str(data), "--num-generations", "4", "--k", "1,4"]
    assert cli.main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["prompts"] == 3 and summary["num_generations"] == 4
    assert 0 <= summary["pass@1"] <= summary["pass@4"] <= 1
    assert json.loads((run / "eval.json").read_text())["reward"] == summary["reward"]
    assert cli.main([*argv, "--k", "5"]) == 2  # k above the completions a prompt
    assert "k must lie in [1, num_generations=4], got 5" in capsys.readouterr().err


class FakeTracker:
    """The three calls transformers' W&B and Trackio integrations make (init, log, finish),
    recorded: a stand-in for a package this machine does not install."""

    def __init__(self):
        self.calls = []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs["name"]))

    def log(self, values, step):
        self.calls.append(("log", step, sorted(values)))

    def finish(self):
        self.calls.append(("finish",))


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_report_to_a_tracker_sends_every_log_line_where_installed(name, tmp_path, monkeypatch):
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec(name) is None:  # a missing package is named, never skipped
        with pytest.raises(ValueError, match=f"report-to '{name}' needs the {name} package"):
            _trainer(tmp_path, report_to=name)
    tracker = FakeTracker()
    module = types.ModuleType(name)
    module.init, module.log, module.finish = tracker.init, tracker.log, tracker.finish
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    monkeypatch.setitem(sys.modules, name, module)
    trainer = _trainer(
        tmp_path,
        report_to=[name],
        logging_steps=2,
        run_name="mine",
        eval_strategy="steps",
        eval_steps=4,
    )
    trainer.train()
    assert tracker.calls[0] == ("init", "mine") and tracker.calls[-1] == ("finish",)
    logged = [call for call in tracker.calls if call[0] == "log"]
    train = [call for call in logged if "train/loss" in call[2]]
    assert [call[1] for call in train] == [2, 4]
    assert "train/reward" in train[0][2]
    # The evaluation too, under transformers' names (eval/reward), at the step it evaluated.
    evaluated = [call for call in logged if "eval/reward" in call[2]]
    assert [call[1] for call in evaluated] == [4] and "eval/pass@1" in evaluated[0][2]
