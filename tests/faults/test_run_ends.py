"""A run ends with its last update and keeps what it made: the rollout side starts no chunk past
the last one the trainer takes (a long batch of generation no longer holds the end of the run,
nor fails it), outputs are saved before the rollout side is closed, and Ctrl-C or SIGTERM
leave the last completed step's model with exit codes 130 and 143. On every transport."""

import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from nostall.algos.grpo import GRPOCommandConfig, GRPOTrainer
from nostall.runtime.thread import RolloutLoop

ROOT = Path(__file__).resolve().parent.parent.parent


class _Chunk:
    version = -1


def _interruptible() -> None:
    """In the child before exec: SIGINT as a terminal's Ctrl-C delivers it. A shell's
    background job (`cmd &` in a script, nohup) starts with SIGINT ignored, Python then keeps
    ignoring it, and a test run from one would wait on a child that never stops."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_the_thread_loop_starts_no_chunk_past_the_last():
    model = torch.nn.Linear(1, 1)
    fills = []

    def slow_fill(chunk):
        fills.append(time.perf_counter())
        time.sleep(0.5)

    loop = RolloutLoop(
        [_Chunk() for _ in range(3)],
        slow_fill,
        torch.nn.Linear(1, 1),
        model,
        staleness=1,
        join_timeout_s=0.1,
    )
    loop.expect(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fill still running at the close would warn
        with loop:
            for _ in range(3):
                index, _ = loop.next_chunk()
                loop.release(index)
                loop.publish(model)
    assert len(fills) == 3


def test_a_fill_still_running_at_the_close_does_not_fail_the_run():
    model = torch.nn.Linear(1, 1)
    loop = RolloutLoop(
        [_Chunk() for _ in range(3)],
        lambda chunk: time.sleep(0.5),
        torch.nn.Linear(1, 1),
        model,
        staleness=1,
        join_timeout_s=0.1,
    )
    with pytest.warns(RuntimeWarning, match="still inside a chunk"), loop:
        index, _ = loop.next_chunk()
        loop.release(index)
        loop.publish(model)  # (no expect: a next chunk is started, and is running at the close)


@pytest.mark.parametrize("backend", ["thread", "process", "ray"])
def test_a_run_generates_no_batch_past_its_last_step(backend, tmp_path):
    (tmp_path / "counted.py").write_text(
        "import os, time\n"
        "def reward(prompts, completions, **kwargs):\n"
        "    with open(os.environ['NOSTALL_TEST_CALLS'], 'a') as f:\n"
        "        f.write('x')\n"
        "    time.sleep(0.2)\n"
        "    return [0.0] * len(completions)\n"
    )
    calls = tmp_path / "calls"
    calls.write_text("")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NOSTALL_TEST_CALLS", str(calls))
        mp.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
        mp.syspath_prepend(str(tmp_path))
        config = GRPOCommandConfig(
            steps=4,
            num_prompts=2,
            num_generations=2,
            staleness=2,
            watch_syncs=False,
            backend=backend,
            reward="counted:reward",
            output_dir=str(tmp_path / "out"),
        )
        GRPOTrainer(args=config).train()
    assert len(calls.read_text()) == 4  # the 4 batches trained on, none ahead of nothing
    assert (tmp_path / "out" / "model" / "config.json").exists()


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_keeps_its_last_model_and_says_why(tmp_path, sig, code):
    (tmp_path / "slow.py").write_text(
        "import time\n"
        "def reward(prompts, completions, **kwargs):\n"
        "    time.sleep(0.05)\n"
        "    return [float(len(c)) for c in completions]\n"
    )
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nostall",
            "train",
            "grpo",
            "--reward",
            "slow:reward",
            "--steps",
            "100000",
            "--no-progress",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"},
        preexec_fn=_interruptible,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any((out / "tensorboard").glob("*/events.*")):
        time.sleep(0.2)  # until the run is training (its log exists once it is built)
    time.sleep(2.0)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)  # a bound against a hang
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr, stderr
    assert (out / "model" / "config.json").exists() and any((out / "model").glob("*.safetensors"))
