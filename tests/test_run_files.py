"""A run's files: pruning deletes only what this run's lineage wrote and never the last good
checkpoint; a run does not write over an earlier one; every output is written whole (a
temporary file no one else names, renamed into place); a policy file chooses no code."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nostall.algos.grpo as grpo
from nostall import files
from nostall.train import checkpoint

ROOT = Path(__file__).resolve().parent.parent


def nostall(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nostall.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def grpo_args(tmp_path, **changes) -> grpo.GRPOCommandConfig:
    settings = dict(
        steps=4,
        num_prompts=2,
        num_generations=2,
        watch_syncs=False,
        staleness=0,
        output_dir=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "run_{step}.pt"),
        checkpoint_every=2,
        save_total_limit=1,
    )
    return grpo.GRPOCommandConfig(**{**settings, **changes})


def test_pruning_keeps_the_new_checkpoint_beside_another_runs_higher_step(tmp_path):
    """An abandoned longer run's run_999.pt outranked the new checkpoints by step number: the
    new one was deleted as soon as it was written."""
    other = tmp_path / "run_999.pt"
    other.write_bytes(b"another run's checkpoint")
    result = nostall(
        "train",
        "grpo",
        "--model",
        "tiny",
        "--task",
        "copy",
        "--steps",
        "4",
        "--num-prompts",
        "2",
        "--num-generations",
        "2",
        "--no-progress",
        "--checkpoint",
        str(tmp_path / "run_{step}.pt"),
        "--checkpoint-every",
        "2",
        "--save-total-limit",
        "1",
        "--out",
        str(tmp_path / "out"),
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("run_*.pt")) == ["run_4.pt", "run_999.pt"]
    assert other.read_bytes() == b"another run's checkpoint"


def test_a_lineage_read_from_a_checkpoint_deletes_no_file_that_is_not_a_checkpoint(tmp_path):
    victim = tmp_path / "notes.txt"
    victim.write_text("keep me")
    old = tmp_path / "old.pt"
    checkpoint.save(old, "grpo", {}, {})
    kept, _ = checkpoint.prune([str(victim), str(old), str(tmp_path / "new.pt")], keep=1)
    assert kept == [str(tmp_path / "new.pt")]
    assert victim.read_text() == "keep me" and not old.exists()


def test_a_diverged_grpo_run_stops_keeping_its_last_good_checkpoint(tmp_path):
    trainer = grpo.GRPOTrainer(args=grpo_args(tmp_path))
    update = trainer.update

    def diverging(chunk, step):
        metrics = update(chunk, step)
        if step == 3:
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(float("nan"))
        return metrics

    trainer.update = diverging
    with pytest.raises(FloatingPointError, match=r"step 4: .*NaN.*last good one is .*run_2\.pt"):
        trainer.train()
    assert [p.name for p in tmp_path.glob("run_*.pt")] == ["run_2.pt"]
    checkpoint.load(tmp_path / "run_2.pt", "grpo")  # whole and finite


def test_grpo_refuses_to_resume_from_non_finite_weights(tmp_path):
    args = grpo_args(tmp_path, steps=2)
    grpo.GRPOTrainer(args=args).train()
    saved_args, state = checkpoint.load(tmp_path / "run_2.pt", "grpo")
    name = next(iter(state["model"]))
    state["model"] = {**state["model"], name: torch.full_like(state["model"][name], float("inf"))}
    checkpoint.save(tmp_path / "bad.pt", "grpo", saved_args, state)
    resumed = grpo_args(tmp_path, steps=4, resume=str(tmp_path / "bad.pt"))
    with pytest.raises(checkpoint.CheckpointError, match=f"{name} holds NaN or inf"):
        grpo.GRPOTrainer(args=resumed)


def ppo(out, *extra):
    return nostall(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--total-timesteps",
        "2048",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    )


def test_a_second_run_does_not_write_over_the_first(tmp_path):
    out = tmp_path / "run"
    assert ppo(out).returncode == 0
    first = (out / "policy.pt").read_bytes()
    again = ppo(out, "--seed", "7")
    assert again.returncode == 2 and "holds a previous run" in again.stderr
    assert "--overwrite" in again.stderr and "Traceback" not in again.stderr
    assert (out / "policy.pt").read_bytes() == first
    assert ppo(out, "--seed", "7", "--overwrite").returncode == 0
    assert (out / "policy.pt").read_bytes() != first


def test_the_default_folder_moves_to_the_next_free_name_and_says_so(tmp_path):
    args = ("train", "ppo", "--env", "CartPole-v1", "--total-timesteps", "2048", "--no-progress")
    assert nostall(*args, cwd=tmp_path).returncode == 0
    second = nostall(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "runs/ppo-CartPole-v1-0-2" in second.stderr
    assert (tmp_path / "runs/ppo-CartPole-v1-0/policy.pt").exists()
    assert (tmp_path / "runs/ppo-CartPole-v1-0-2/policy.pt").exists()


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "policy.pt"
    target.write_bytes(b"previous")
    with pytest.raises(KeyboardInterrupt), files.replaced(target) as f:
        f.write(b"half of the new")
        raise KeyboardInterrupt  # a second Ctrl-C mid-write
    assert target.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["policy.pt"]


def test_policy_and_reports_are_written_through_a_temporary_file(tmp_path, monkeypatch):
    """A kill between the first byte and the last leaves the previous policy.pt: the record is
    written elsewhere first (the save here fails halfway)."""
    from nostall.algos.ppo.policy import save_policy

    target = tmp_path / "policy.pt"
    target.write_bytes(b"previous")

    def half(record, f):
        f.write(b"\x80half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half)
    with pytest.raises(OSError):
        save_policy({"format": 1}, target)
    assert target.read_bytes() == b"previous" and os.listdir(tmp_path) == ["policy.pt"]


def test_a_new_file_gets_the_permissions_open_gives(tmp_path):
    files.write_text(tmp_path / "report.txt", "x")
    (tmp_path / "plain.txt").write_text("x")
    assert (tmp_path / "report.txt").stat().st_mode == (tmp_path / "plain.txt").stat().st_mode


def test_a_checkpoint_never_follows_a_name_planted_beside_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("someone else's file")
    (tmp_path / "ck.pt.tmp").symlink_to(victim)
    checkpoint.save(tmp_path / "ck.pt", "ppo", {}, {"x": torch.ones(3)})
    assert victim.read_text() == "someone else's file"
    assert checkpoint.load(tmp_path / "ck.pt", "ppo")[1]["x"].tolist() == [1, 1, 1]


def test_logged_completions_create_the_output_folder(tmp_path):
    out = tmp_path / "not" / "yet"
    args = grpo_args(
        tmp_path,
        steps=2,
        output_dir=str(out),
        log_completions=True,
        log_interval=1,
        checkpoint=None,
        save_total_limit=None,
    )
    grpo.GRPOTrainer(args=args).train()
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [1, 2]


EVIL = """
from pathlib import Path
Path(__file__).with_name("ran").write_text("the policy file chose this code")
"""


def test_a_policy_file_cannot_choose_code_for_eval(tmp_path):
    out = tmp_path / "run"
    assert ppo(out).returncode == 0
    record = torch.load(out / "policy.pt", weights_only=True)
    torch.save({**record, "env_id": "evilenv:Evil"}, out / "policy.pt")
    (out / "evilenv.py").write_text(EVIL)
    for command in (
        [sys.executable, "-m", "nostall", "eval", "."],
        [sys.executable, "-m", "nostall.cli", "eval", str(out)],
    ):
        result = subprocess.run(command, capture_output=True, text=True, cwd=out, timeout=300)
        assert result.returncode == 2
        assert "'evilenv:Evil', code to import" in result.stderr
        assert "--env evilenv:Evil" in result.stderr
    assert not (out / "ran").exists()
    named = nostall("eval", str(out), "--env", "CartPole-v1", "--episodes", "1")
    assert named.returncode == 0, named.stderr
