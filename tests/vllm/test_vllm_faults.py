"""vLLM generating on Ray workers: a worker killed while its engine generates a batch is
restarted by Ray (its engine started anew from the weights it is sent), its batch is dropped,
counted and named in the result, and the run goes on to its last step; a driver killed
mid-run leaves no Ray process and no engine folder behind."""

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from nostall.algos import grpo
from nostall.algos.grpo.setup import build
from nostall.algos.grpo.trainer import GRPOTrainer
from nostall.runtime.ray.losses import await_restart
from tests.runtime.driver_kill import kill_mid_run, ray_processes

pytestmark = pytest.mark.vllm
ray = pytest.importorskip("ray", reason="Ray is not installed in this venv")


def _leftovers() -> set[str]:
    """Ray's processes and vLLM engine folders on this machine."""
    return ray_processes() | {str(p) for p in Path(tempfile.gettempdir()).glob("nostall-vllm-*")}


def test_a_killed_driver_leaves_nothing_running(model_dir):
    """(First in the file: before this module's own cluster starts.)"""
    seconds = kill_mid_run(
        "from nostall.algos import grpo\n"
        f"args = grpo.GRPOCommandConfig(model={str(model_dir)!r}, generator='vllm', backend='ray',"
        " steps=10**6, max_new_tokens=5, watch_syncs=False, log_interval=1)\n"
        "grpo.train(args, log=lambda step, m: print('running', flush=True))\n",
        _leftovers,
    )
    print(f"nothing left {seconds:.1f} s after the kill")


def test_a_killed_vllm_worker_is_restarted_and_its_batch_dropped(local_cluster, model_dir):
    args = grpo.GRPOCommandConfig(
        model=str(model_dir),
        generator="vllm",
        backend="ray",
        staleness=1,
        steps=8,
        max_new_tokens=48,
        learning_rate=1.1e-3,
        watch_syncs=False,
    )
    setup = build(args)
    trainer = GRPOTrainer(args=args, setup=setup)
    update, killed, recovered = trainer.update, [], []

    def killing(batch, step):
        # At staleness 1 the worker generates the next batch during this update (48 tokens a
        # completion: longer than the update).
        if step == 3:
            pid, _ = ray.get(setup.loop.workers[0].where.remote())
            os.kill(pid, signal.SIGKILL)
            killed.append((pid, time.perf_counter()))
        elif killed and not recovered:
            await_restart(ray, setup.loop.workers[0], "worker 0", 120.0)
            pid, _ = ray.get(setup.loop.workers[0].where.remote())
            recovered.append((pid, time.perf_counter()))
        return update(batch, step)

    trainer.update = killing
    result = trainer.train()
    assert len(result.rewards) == 8
    assert result.dropped_chunks >= 1
    assert all("worker 0" in cause for cause in result.dropped_causes), result.dropped_causes
    (old_pid, killed_at), (new_pid, back_at) = killed[0], recovered[0]
    assert new_pid != old_pid  # a new process, its engine built again
    print(
        f"{result.dropped_chunks} dropped ({result.dropped_causes}); the next batch came "
        f"{back_at - killed_at:.1f} s after the kill"
    )
    assert back_at - killed_at < 120
