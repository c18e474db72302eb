"""The process transport's weight lock: a copy takes as long as it takes while its holder lives
(a multi-GB model, a busy host), and a holder that died is named instead of waited for."""

import functools
import os
import signal
import threading

import pytest
import torch
import torch.multiprocessing as mp

import nostall.envs
from nostall.algos.ppo.agent import ActorCritic
from nostall.runtime import RuntimeStopped
from nostall.runtime.process.loop import ProcessLoop
from nostall.runtime.process.weights import SharedWeights
from tests.runtime.env_loops import cartpole, env_loop

HOLD_S = 6.0  # longer than the fixed 5 s the lock was once limited to


def test_a_long_copy_is_waited_for_while_its_holder_is_alive():
    shared = SharedWeights(mp.get_context("spawn"), torch.nn.Linear(4, 4))
    holding, released = threading.Event(), threading.Event()

    def copy_for_a_while():  # the other side, copying a large model under the lock
        with shared.lock:
            holding.set()
            released.wait(HOLD_S)
            released.set()

    holder = threading.Thread(target=copy_for_a_while)
    holder.start()
    assert holding.wait(10)
    checks = []
    with shared.locked(alive=lambda: checks.append(holder.is_alive())):
        assert released.is_set()  # taken only after the holder let it go
    holder.join()
    assert checks and all(checks)  # the holder's liveness was checked all along


def _cartpole_loop() -> tuple[ProcessLoop, torch.nn.Module]:
    env = nostall.envs.make("CartPole-v1", 2)
    agent = ActorCritic.for_env(env)
    env.close()
    loop = env_loop("process", agent, make_env=functools.partial(cartpole, 2), num_steps=8)
    return loop, agent


def test_a_rollout_process_killed_holding_the_lock_is_named_by_publish():
    loop, agent = _cartpole_loop()
    with loop:
        loop.next_chunk()
        assert loop._weights.lock.acquire(timeout=10)  # as the child would, mid-copy
        os.kill(loop._child.process.pid, signal.SIGKILL)
        with pytest.raises(RuntimeStopped, match=r"exited unexpectedly \(exit code -9\)"):
            loop.publish(agent)
    assert mp.active_children() == []
