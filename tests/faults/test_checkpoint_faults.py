"""Damaged, hostile and mismatched checkpoints, and a full disk while saving: each gets a clear
message naming the cause and exit 2 from the command, quickly, and the last good checkpoint
stays intact."""

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nostall.algos import ppo
from nostall.train import checkpoint

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--total-timesteps", "4096", "--no-progress", "--no-watch-syncs"]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "good.pt"
    ppo.train(ppo.PPOConfig(total_timesteps=2048, checkpoint=str(path), watch_syncs=False))
    return path


def _resume(path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nostall.cli",
            "train",
            "ppo",
            *COMMON,
            "--resume",
            str(path),
            "--out",
            str(path.parent / "run"),
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    return result, time.perf_counter() - started


def _rewrite(good: Path, target: Path, edit) -> Path:
    """A checkpoint whose state was edited, re-saved with a valid checksum (damage the
    checksum cannot catch: the loaded values must be validated)."""
    args, state = checkpoint.load(good, "ppo")
    edit(state)
    checkpoint.save(target, "ppo", args, state)
    return target


def _damage_bytes(good: Path, target: Path, how: str) -> Path:
    data = bytearray(good.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "bit-flipped":
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0xFF
    elif how == "random bytes":
        data = bytearray(os.urandom(len(data)))
    target.write_bytes(bytes(data))
    return target


@pytest.mark.parametrize(
    "how,message",
    [
        ("truncated", "unreadable"),
        ("bit-flipped", "damaged|unreadable"),
        ("random bytes", "unreadable"),
    ],
)
def test_damaged_files_are_refused(good, tmp_path, how, message):
    result, _ = _resume(_damage_bytes(good, tmp_path / "bad.pt", how))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    import re

    assert re.search(message, result.stderr), result.stderr


def _set_env_minus_one(state):
    state["runtime"]["env"]["words"].fill_(-1)  # every generator word, count, flag and state


def _nan_weights(state):
    next(iter(state["agent"].values())).fill_(float("nan"))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda s: s.clear(), "has no 'agent'"),
        (lambda s: s.pop("optimizer"), "has no 'optimizer'"),
        (lambda s: s.update(iteration=-3), "bad iteration"),
        (_nan_weights, "holds NaN or inf"),
        (_set_env_minus_one, "step count -1|generator state|not finite|reset flag"),
    ],
)
def test_damaged_contents_are_refused(good, tmp_path, edit, message):
    result, _ = _resume(_rewrite(good, tmp_path / "edited.pt", edit))
    assert result.returncode in (1, 2), result.stderr
    import re

    assert re.search(message, result.stderr), result.stderr


def test_a_file_that_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([1, 2, 3], path)
    result, _ = _resume(path)
    assert result.returncode == 2 and "is not a nostall checkpoint" in result.stderr


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/nostall-pwned",))


def test_a_checkpoint_cannot_run_code(tmp_path):
    Path("/tmp/nostall-pwned").unlink(missing_ok=True)
    path = tmp_path / "evil.pt"
    buffer = io.BytesIO()
    torch.save({"format": "nostall-checkpoint", "x": _Payload()}, buffer)
    path.write_bytes(buffer.getvalue())
    result, _ = _resume(path)
    assert result.returncode == 2 and "unreadable" in result.stderr
    assert not Path("/tmp/nostall-pwned").exists()


@pytest.mark.parametrize(
    "extra,message",
    [(["--env", "Acrobot-v1"], "env_id"), (["--hidden", "32"], "hidden (saved 64, now 32)")],
)
def test_a_checkpoint_of_another_env_or_network_is_refused(good, extra, message):
    result, _ = _resume(good, *extra)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "cannot resume: arguments differ" in result.stderr


def test_a_full_disk_keeps_the_last_good_checkpoint(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.decode().strip()}")
    try:
        path = disk / "c.pt"
        small = {"w": torch.zeros(100)}
        checkpoint.save(path, "ppo", {}, small)
        with pytest.raises(OSError, match="No space left"):
            checkpoint.save(path, "ppo", {}, {"w": torch.zeros(100_000)})
        _, state = checkpoint.load(path, "ppo")
        assert torch.equal(state["w"], small["w"])
        assert [p.name for p in disk.iterdir()] == ["c.pt"]  # no half-written file left
        del state  # (its tensors map the file: the unmount below needs them gone)
    finally:
        subprocess.run(["umount", str(disk)], check=False)
