"""GRPO as a TRL user would try it: bad input named before training starts, TRL's semantics for
rewards and dataset columns, resumes that report what the uninterrupted run reports, and logs
that neither vanish nor mix. Each test failed on the code before it."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nostall.algos import grpo, ppo
from nostall.algos.grpo import GRPOCommandConfig, GRPOTrainer
from nostall.lm.rewards import Rewards
from nostall.lm.tasks import partial_credit

ROOT = Path(__file__).resolve().parent.parent.parent
FAST = dict(
    steps=6, num_prompts=4, num_generations=4, watch_syncs=False, log_interval=2, staleness=0
)
ROWS = [
    {"prompt": "abcde=", "answer": "abcde"},
    {"prompt": "hgfed=", "answer": "hgfed"},
    {"prompt": "cabbe="},
    {"prompt": "dghaa=", "answer": "dghaa"},
]


def _answer_or_none(prompts, completions, answer, **kwargs):
    """Not applicable (None) where a row has no answer, as TRL's rewards do."""
    return [
        None if a is None else partial_credit(c, a)
        for c, a in zip(completions, answer, strict=True)
    ]


def test_a_row_without_an_optional_column_gets_none():
    seen = []

    def reward(prompts, completions, answer, **kwargs):
        seen.extend(answer)
        return _answer_or_none(prompts, completions, answer)

    GRPOTrainer(
        model="tiny", reward_funcs=reward, train_dataset=ROWS, args=GRPOCommandConfig(**FAST)
    ).train()
    assert None in seen and "abcde" in seen


def test_none_and_nan_rewards_are_not_applicable_and_arrays_are_taken():
    rewards = Rewards(
        [
            lambda prompts, completions, **kw: [None, 1.0, float("nan")],
            lambda prompts, completions, **kw: np.array([0.5, 0.25, 2.0]),
        ],
        [1.0, 2.0],
    )
    assert rewards(["p"] * 3, ["a", "b", "c"], {}) == [1.0, 1.5, 4.0]
    nothing = Rewards([lambda prompts, completions, **kw: [None, None]])
    assert nothing(["p"] * 2, ["a", "b"], {}) == [0.0, 0.0]  # TRL's nansum of nothing


@pytest.mark.parametrize("value", ["1.0", {"score": 1}])
def test_a_reward_that_is_not_a_number_is_refused_naming_the_reward(value):
    def my_reward(prompts, completions, **kwargs):
        return [value] * len(completions)

    with pytest.raises(ValueError, match="reward function my_reward returned"):
        Rewards([my_reward])(["p"], ["a"], {})


@pytest.mark.parametrize(
    "change,message",
    [
        (
            dict(reward="tests.algos.grpo.test_grpo:_reward_raises", reward_weights="nan"),
            "--reward-weights must be finite",
        ),
        (
            dict(reward="tests.algos.grpo.test_grpo:_reward_raises", reward_weights="1,inf"),
            "--reward-weights must be finite",
        ),
        (dict(reward_weights="2"), "--reward-weights weighs the functions of --reward"),
        (
            dict(checkpoint="ck_{run}.pt"),
            "--checkpoint 'ck_{run}.pt': the only placeholder is {step}",
        ),
        (dict(checkpoint="ck-{iteration}.pt"), "the only placeholder is {step}"),
        (dict(checkpoint="ck-{.pt"), "the only placeholder is {step}"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(change, message):
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
        grpo.build(GRPOCommandConfig(**{**FAST, **change}))


def test_a_ppo_checkpoint_placeholder_is_checked_too():
    with pytest.raises(ValueError, match=r"the only placeholder is \{iteration\}"):
        ppo.PPOConfig(checkpoint="ck-{step}.pt").check()


def test_resume_reports_what_the_uninterrupted_run_reports(tmp_path):
    common = dict(
        FAST,
        steps=40,
        target_reward=0.0,
        watch_syncs=True,
        checkpoint=str(tmp_path / "ck-{step}.pt"),
        checkpoint_every=10,
    )
    full = grpo.train(GRPOCommandConfig(**common))
    assert full.steps_to_target == 10  # the first full window of 10 steps
    with pytest.raises(ValueError, match="--steps 20 is not past the checkpoint's step 20"):
        GRPOTrainer(
            args=GRPOCommandConfig(**{**common, "steps": 20, "resume": str(tmp_path / "ck-20.pt")})
        )
    resumed = grpo.train(
        GRPOCommandConfig(
            **{
                **common,
                "resume": str(tmp_path / "ck-20.pt"),
                "checkpoint": None,
                "torch_threads": 2,
            }
        )
    )
    assert resumed.steps_to_target == full.steps_to_target  # the crossing, not the resume
    assert resumed.rewards == full.rewards
    assert resumed.syncs_per_update == 0  # the resumed process's own 3rd and 4th steps


def _nostall(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nostall", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )


def test_no_progress_keeps_tensorboard_and_two_runs_keep_two_logs(tmp_path):
    (tmp_path / "my_rewards.py").write_text(  # beside the data, run from its own folder
        "def length(prompts, completions, **kwargs):\n"
        "    return [len(c) / 5 for c in completions]\n"
    )
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    for again in ([], ["--overwrite"]):  # (a folder holding a run is written only if told)
        result = _nostall(
            "train",
            "grpo",
            "--dataset",
            "data.jsonl",
            "--reward",
            "my_rewards:length",
            "--steps",
            "4",
            "--num-prompts",
            "2",
            "--no-progress",
            "--out",
            "run",
            *again,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
    runs = list((tmp_path / "run" / "tensorboard").iterdir())
    assert len(runs) == 2 and all(any(r.glob("events.*")) for r in runs)


def test_dataset_files_and_folders_as_users_save_them(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [r for r in ROWS if "answer" in r]
    data = datasets.Dataset.from_list(rows)
    data.to_parquet(str(tmp_path / "data.parquet"))
    datasets.DatasetDict({"train": data, "test": data}).save_to_disk(str(tmp_path / "dict"))
    datasets.DatasetDict({"test": data}).save_to_disk(str(tmp_path / "test_only"))
    for path in (tmp_path / "data.parquet", tmp_path / "dict"):
        result = grpo.train(GRPOCommandConfig(**FAST, dataset=str(path)))
        assert len(result.rewards) == FAST["steps"]
    with pytest.raises(ValueError, match=r"holds the splits \['test'\]; its `train` split"):
        grpo.build(GRPOCommandConfig(**FAST, dataset=str(tmp_path / "test_only")))
    (tmp_path / "binary.jsonl").write_bytes(b"\x92\x00\x01")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        grpo.build(GRPOCommandConfig(**FAST, dataset=str(tmp_path / "binary.jsonl")))


@pytest.mark.parametrize("column", ["completions", "prompts"])
def test_a_column_named_as_a_reward_argument_is_refused_at_load(tmp_path, column):
    """It would reach the reward functions twice: a TypeError at the first reward call."""
    rows = [{**row, column: "x"} if i == 2 else row for i, row in enumerate(ROWS)]
    with pytest.raises(ValueError, match=f"row 3: a column named '{column}' would collide"):
        GRPOTrainer(
            model="tiny",
            reward_funcs=_answer_or_none,
            train_dataset=rows,
            args=GRPOCommandConfig(**FAST),
        )
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nostall.cli",
            "train",
            "grpo",
            "--model",
            "tiny",
            "--dataset",
            str(path),
            "--reward",
            "nostall.lm.tasks:answer_reward",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 2 and f"column named '{column}'" in result.stderr


def test_a_prompt_the_tokenizer_cannot_read_is_refused():
    with pytest.raises(ValueError, match="prompt 'xyz=' has text the tokenizer does not know"):
        GRPOTrainer(
            model="tiny",
            reward_funcs=_answer_or_none,
            train_dataset=[{"prompt": "xyz="}],
            args=GRPOCommandConfig(**FAST),
        )


def test_a_run_trains_on_from_the_model_it_saved(tmp_path):
    """The saved tokenizer reloads with an unknown token the model has no row for (Qwen2's
    tokenizer class adds one): it is not banned past the vocabulary, and the run goes on."""
    GRPOTrainer(args=GRPOCommandConfig(**FAST, output_dir=str(tmp_path / "first"))).train()
    again = GRPOTrainer(
        model=str(tmp_path / "first" / "model"), args=GRPOCommandConfig(**FAST)
    ).train()
    assert len(again.rewards) == FAST["steps"]


def test_a_failed_model_save_leaves_no_half_model(tmp_path, monkeypatch):
    """A full disk mid-save (EFBIG after config.json) leaves no folder that looks like a model,
    and a model saved before stays whole."""
    import errno

    trainer = GRPOTrainer(args=GRPOCommandConfig(**FAST))
    trainer.train()
    out = tmp_path / "model"
    trainer.save_model(out)
    before = sorted(p.name for p in out.iterdir())
    model = trainer.model

    def full_disk(path, **kwargs):
        model.config.save_pretrained(path)
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(model, "save_pretrained", full_disk)
    with pytest.raises(OSError, match="File too large"):
        trainer.save_model(out)
    assert sorted(p.name for p in out.iterdir()) == before  # the earlier model, whole
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # nothing half-written beside it
    with pytest.raises(OSError):
        trainer.save_model(tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()
