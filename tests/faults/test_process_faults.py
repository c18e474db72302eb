"""Fault injection on the process backend: kill or stop the rollout child, SIGTERM, SIGINT or
SIGKILL the trainer. Each: a clear message naming the cause, a non-zero exit, within about a
second, and no process or shared-memory segment left behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from nostall.algos import ppo
from nostall.algos.ppo.setup import make_transport
from nostall.runtime import RuntimeStopped

ROOT = Path(__file__).resolve().parents[2]


def _interruptible() -> None:
    """In the child before exec: SIGINT as a terminal's Ctrl-C delivers it. A shell's
    background job (`cmd &` in a script, nohup) starts with SIGINT ignored, Python then keeps
    ignoring it, and a test run from one would wait on a child that never stops."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent has not reaped it yet).
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def _runtime(**kw):
    args = ppo.PPOConfig(backend="process", watch_syncs=False)
    import nostall.envs
    from nostall.algos.ppo.agent import ActorCritic

    env = nostall.envs.make("CartPole-v1", 8, seed=0, autoreset_mode="SameStep")
    runtime = make_transport(args, env, ActorCritic.for_env(env, 64))
    for k, v in kw.items():
        setattr(runtime._child, k, v)  # the child process watcher's timeouts
    return runtime


def test_killed_child_is_reported_within_a_second():
    runtime = _runtime()
    with pytest.raises(RuntimeStopped, match=r"exited unexpectedly \(exit code -9\)"), runtime:
        slot, _ = runtime.next_chunk()
        runtime.release(slot)
        os.kill(runtime._child.process.pid, signal.SIGKILL)
        started = time.perf_counter()
        try:
            while True:
                slot, _ = runtime.next_chunk()
                runtime.release(slot)
                runtime.publish(_AgentStandIn(), weights=False)
        finally:
            # A bound against a hang, generous for a loaded machine (measured: see the note).
            assert time.perf_counter() - started < 5
    assert mp.active_children() == []


def test_stopped_child_trips_the_liveness_timeout():
    runtime = _runtime(liveness_timeout_s=1.0)
    with pytest.raises(RuntimeStopped, match="made no progress for"), runtime:
        slot, _ = runtime.next_chunk()
        runtime.release(slot)
        os.kill(runtime._child.process.pid, signal.SIGSTOP)
        started = time.perf_counter()
        try:
            runtime.publish(_AgentStandIn(), weights=False)
            runtime.next_chunk()
        finally:
            assert time.perf_counter() - started < 6
    assert mp.active_children() == []


class _AgentStandIn:
    def state_dict(self):
        return {}


TRAIN = [
    sys.executable,
    "-m",
    "nostall.cli",
    "train",
    "ppo",
    "--backend",
    "process",
    "--total-timesteps",
    "100000000",
    "--no-progress",
    "--no-watch-syncs",
]


def _start_trainer(tmp_path):
    before = _shm()
    proc = subprocess.Popen(
        [*TRAIN, "--out", str(tmp_path / "run")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until its rollout process is up
        spawned = [
            c
            for c in _children_of(proc.pid)
            if "multiprocessing" in _cmdline(c) and "resource_tracker" not in _cmdline(c)
        ]
        if spawned:
            time.sleep(2.0)  # training under way (the child builds its side first)
            return proc, spawned[0], before
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the rollout process never started")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 128 + 15), (signal.SIGINT, 128 + 2)])
def test_terminating_the_trainer_stops_everything(tmp_path, sig, code):
    proc, child, before = _start_trainer(tmp_path)
    proc.send_signal(sig)
    started = time.monotonic()
    # Bounds against a hang, not speed claims: on a loaded 2-core machine a 30 s bound on the
    # exit (the interpreter's shutdown and the child's join) once expired.
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert time.monotonic() - started < 60  # the child's join included
    assert not _alive(child)
    assert _shm() <= before


def test_killing_the_trainer_ends_the_orphaned_child_within_a_second(tmp_path):
    proc, child, before = _start_trainer(tmp_path)
    proc.kill()
    proc.wait()
    assert _gone_within(child, 5), "the rollout process outlived its trainer"
    time.sleep(1.0)  # multiprocessing's resource tracker cleans up after its parent
    assert _shm() <= before
