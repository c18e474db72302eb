"""A hung reward function or generation is named and stops the run, on every backend: the
rollout side marks each step (a reward call, a decode step) on a watchdog with its limit, and
the trainer checks it while it waits (before: a hung reward was waited on forever on the thread
backend; the process backend's child beat only between batches, so a fixed 120 s killed any
batch longer than that; the Ray loop waited without a timeout)."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nostall.runtime.watchdog import HangError, Watchdog, run_watched

ROOT = Path(__file__).resolve().parent.parent.parent


def test_a_step_past_its_limit_is_named():
    dog = Watchdog()
    dog.check()  # idle: nothing to time
    dog.doing("reward function slow", 0.05, "reward_timeout")
    dog.check()
    time.sleep(0.1)
    with pytest.raises(
        HangError,
        match=r"reward function slow has not returned after .* "
        r"\(limit: reward_timeout = 0.05 s\)",
    ):
        dog.check()
    dog.doing("generation, decode step 3", 0.05)  # a beat restarts the clock
    dog.check()
    dog.idle()
    time.sleep(0.1)
    dog.check()


def test_run_watched_returns_raises_or_names_the_hang():
    dog = Watchdog()
    assert run_watched(lambda: 7, dog) == 7
    with pytest.raises(ZeroDivisionError):
        run_watched(lambda: 1 / 0, dog)
    never = threading.Event()

    def hang():
        dog.doing("reward function stuck", 0.1)
        never.wait()

    with pytest.raises(HangError, match="reward function stuck"):
        run_watched(hang, dog)
    never.set()


HANG = (
    "import os, threading, time\n"
    "def reward(prompts, completions, **kwargs):\n"
    "    with open(os.environ['NOSTALL_TEST_HUNG_AT'], 'a') as f:  # (a restarted worker\n"
    "        f.write(repr(time.time()) + '\\n')  # may call it again: the first hang counts)\n"
    "    threading.Event().wait()  # forever\n"
)


@pytest.mark.parametrize("backend", ["thread", "process", "ray"])
def test_a_hung_reward_stops_the_run_naming_it(backend, tmp_path):
    """`nostall train grpo` with a reward that never returns: exit 1 with the reward's name
    and the limit, after reward_timeout (2 s here), not a hang. The seconds from the hang to
    the command's exit are printed (-s) for the record."""
    (tmp_path / "hung.py").write_text(HANG)
    hung_at = tmp_path / "hung_at"
    began = time.time()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "nostall",
            "train",
            "grpo",
            "--reward",
            "hung:reward",
            "--backend",
            backend,
            "--reward-timeout",
            "2",
            "--steps",
            "5",
            "--no-progress",
            "--no-watch-syncs",
            "--num-prompts",
            "2",
            "--num-generations",
            "2",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": f"{tmp_path}:{ROOT}",
            "NOSTALL_TEST_HUNG_AT": str(hung_at),
        },
    )
    ended = time.time()
    assert run.returncode == 1, run.stderr
    assert "reward function reward has not returned" in run.stderr, run.stderr
    assert "reward_timeout = 2 s" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    hang = float(hung_at.read_text().split()[0])
    print(
        f"\n{backend}: a hung reward to the command's exit {ended - hang:.1f} s "
        f"(the limit 2 s; the command ran {ended - began:.1f} s in all)"
    )


def test_the_generator_marks_every_decode_step_and_reward_call():
    from nostall.algos import grpo

    class Recording(Watchdog):
        def __init__(self):
            super().__init__()
            self.steps = []

        def doing(self, what, limit_s, limit_name=""):
            self.steps.append((what, limit_s, limit_name))
            super().doing(what, limit_s, limit_name)

    args = grpo.GRPOCommandConfig(
        num_prompts=2,
        num_generations=2,
        max_new_tokens=4,
        min_p=0.01,
        watch_syncs=False,
        reward_timeout=7,
        generation_timeout=9,
    )
    generator = grpo.build(args).generator  # (min_p: the per-token path)
    generator.watchdog = dog = Recording()
    generator(grpo.build(args).loop.slots[0])
    assert dog.steps == [
        ("generation of a batch", 9, "generation_timeout"),
        *[(f"generation, decode step {t}", 9, "generation_timeout") for t in range(4)],
        ("reward function answer_reward", 7, "reward_timeout"),
    ]
    assert not dog.busy  # idle between batches


def test_a_batch_longer_than_the_liveness_timeout_is_not_killed(monkeypatch, tmp_path):
    """A rollout process inside a marked step (here a 2.5 s reward) is held to that step's
    limit, not to the liveness timeout between steps (1 s here, 120 s by default)."""
    import dataclasses

    from nostall.algos import grpo
    from nostall.algos.grpo import setup as grpo_setup

    (tmp_path / "slow_reward.py").write_text(
        "import time\n"
        "def reward(prompts, completions, **kwargs):\n"
        "    time.sleep(2.5)\n"
        "    return [0.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    options, shortened = grpo_setup._transport_options, []

    def short_liveness(*args):  # the run's transport, its liveness timeout 1 s
        shortened.append(dataclasses.replace(options(*args), liveness_timeout_s=1.0))
        return shortened[-1]

    monkeypatch.setattr(grpo_setup, "_transport_options", short_liveness)
    args = grpo.GRPOCommandConfig(
        steps=2,
        num_prompts=2,
        num_generations=2,
        backend="process",
        reward="slow_reward:reward",
        watch_syncs=False,
    )
    result = grpo.GRPOTrainer(args=args).train()
    assert len(shortened) == 1  # (the process was held to 1 s between marked steps)
    assert len(result.rewards) == 2
