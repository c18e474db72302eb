"""`nostall train`: a short run leaves its outputs; bad arguments get a message and exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def nostall(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nostall.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_short_training_run_writes_report_plots_and_logs(tmp_path):
    out = tmp_path / "run"
    result = nostall(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--total-timesteps",
        "8192",
        "--log-interval",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "steps/s" in result.stdout and "syncs per update" in result.stdout
    for name in ("learning_curve.png", "timeline.png", "report.txt", "report.json"):
        assert (out / name).stat().st_size > 0, name
    assert list((out / "tensorboard").iterdir())
    report = json.loads((out / "report.json").read_text())
    assert report["env_steps"] == 8192 and report["syncs_per_update"] == 0
    # PPO at staleness 0: the rollout waits for each publish, so it runs only during the
    # update's bookkeeping after it (logged at 0.0 here); an overlap that counted the waits, or
    # whole spans, would give most of the updates' time.
    assert report["staleness"] == 0 and report["update_overlap"] < 0.1
    assert "rollout ran during" in (out / "report.txt").read_text()


def test_appo_runs_from_the_command_line(tmp_path):
    result = nostall(
        "train", "appo", "--total-timesteps", "4096", "--no-progress", "--out", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert "staleness 1" in result.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["train", "ppo", "--env", "Nope-v0"], "unknown environment 'Nope-v0'"),
        (["train", "ppo", "--num-envs", "-4"], "num_envs must be at least 1"),
        (["train", "ppo", "--total-timesteps", "0"], "total_timesteps must be at least 1"),
        (["train", "ppo", "--staleness", "-1"], "staleness must be at least 0"),
        (["train", "ppo", "--resume", "/nonexistent/ckpt.pt"], "does not exist"),
        (["train", "dqn"], "invalid choice"),
    ],
)
def test_bad_arguments_get_a_message_and_exit_2(args, message):
    result = nostall(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_step_counts_as_whole_floats_and_the_rounding_is_said(tmp_path):
    result = nostall(
        "train",
        "ppo",
        "--total-timesteps",
        "3e3",
        "--no-progress",
        "--no-watch-syncs",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert "3000 steps is not a whole number of batches of 1024" in result.stderr
    assert "training 2048 steps (2 iterations)" in result.stderr
