"""`nostall train grpo`: a short run leaves its report, plots, logs and a model that loads back
with transformers; bad arguments get a message and exit 2; a reward that raises stops the run
with its traceback, quickly."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def nostall(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nostall.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def test_short_run_writes_report_plots_logs_and_model(tmp_path):
    out = tmp_path / "run"
    result = nostall(
        "train",
        "grpo",
        "--task",
        "copy",
        "--model",
        "tiny",
        "--steps",
        "12",
        "--log-interval",
        "4",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "completion tokens/s" in result.stdout
    for name in ("learning_curve.png", "timeline.png", "report.txt", "report.json"):
        assert (out / name).stat().st_size > 0, name
    assert list((out / "tensorboard").iterdir())
    report = json.loads((out / "report.json").read_text())
    for key in (
        "time_to_target_s",
        "steps_to_target",
        "tokens_per_second",
        "generation_ms_per_step",
        "update_ms_per_step",
        "syncs_per_update",
        "mean_version_lag",
    ):
        assert key in report, key
    assert report["steps"] == 12 and report["syncs_per_update"] == 0
    # At staleness 1 the next batch is generated while the update runs: an overlap that
    # missed it would say 0 (0.555 here); a share of the updates' time is at most 1.
    assert report["staleness"] == 1 and 0 < report["update_overlap"] <= 1
    assert "generation ran during" in (out / "report.txt").read_text()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out / "model", local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out / "model", local_files_only=True)
    assert tokenizer("abc=").input_ids == [1, 3, 4, 5, 21]
    assert model.config.hidden_size == 64


def test_a_dataset_and_a_trl_style_reward_work(tmp_path):
    rows = [{"prompt": f"{w}=", "target": w[::-1]} for w in ("abc", "hgf", "cab", "ddc")]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "my_rewards.py").write_text(
        "def reverse_reward(prompts, completions, target, **kwargs):\n"
        "    return [float(c == t) for c, t in zip(completions, target)]\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nostall.cli",
            "train",
            "grpo",
            "--dataset",
            "data.jsonl",
            "--reward",
            "my_rewards:reverse_reward",
            "--steps",
            "4",
            "--no-progress",
            "--num-prompts",
            "2",
            "--out",
            "run",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"},
    )
    assert result.returncode == 0, result.stderr
    assert "on data" in result.stdout


def test_a_reward_that_raises_stops_the_run_with_its_traceback(tmp_path):
    (tmp_path / "broken.py").write_text(
        "def reward(prompts, completions, **kwargs):\n"
        "    raise KeyError('missing column in my reward')\n"
    )
    start = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nostall.cli",
            "train",
            "grpo",
            "--reward",
            "broken:reward",
            "--steps",
            "1000",
            "--no-progress",
            "--out",
            "run",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"},
    )
    elapsed = time.perf_counter() - start
    assert result.returncode == 1
    assert "missing column in my reward" in result.stderr and "broken.py" in result.stderr
    assert elapsed < 60  # start-up included; the failure itself surfaces within a poll interval


@pytest.mark.parametrize(
    "args,message",
    [
        (["--task", "nope"], "unknown task 'nope'"),
        (["--model", "/no/such/dir"], "neither a built-in"),
        (["--num-generations", "1"], "--num-generations must be at least 2"),
        (["--max-new-tokens", "80"], "exceed the model's context"),
        (["--learning-rate", "nan"], "--learning-rate must be a positive finite"),
        (["--resume", "/no/such/ckpt.pt"], "does not exist"),
        (["--device", "tpu"], "--device must be cpu, cuda"),
    ],
)
def test_bad_arguments_get_a_message_and_exit_2(args, message):
    result = nostall("train", "grpo", "--steps", "2", "--no-progress", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
