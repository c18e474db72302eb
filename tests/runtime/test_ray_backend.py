"""The Ray backend: rollout workers as actors on a local cluster (2 CPUs, as on this machine),
the staleness bound and chunk accounting across workers, a worker killed mid-run, placement
errors, and the same run as the thread backend at staleness 0."""

import os
import signal
import time

import pytest
import torch

from nostall.algos import appo, ppo
from nostall.algos.agent import act, make_agent
from nostall.envs.gymnasium_adapter import make_env
from nostall.runtime.storage import slot_layout

ray = pytest.importorskip("ray", reason="Ray (a dev dependency) is not installed")
from nostall.runtime.ray_runtime import RayRuntime  # noqa: E402

FAST = dict(watch_syncs=False, log_interval=1)


@pytest.fixture(scope="module")
def local_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _make_env(seed):
    return make_env("CartPole-v1", 4, seed=seed)


def _runtime(num_workers, staleness, **kwargs) -> RayRuntime:
    env = _make_env(0)
    agent = make_agent(env)
    return RayRuntime(_make_env, make_agent, agent, act, num_workers=num_workers, num_steps=16,
                      staleness=staleness, seed=0, **slot_layout(env), **kwargs)  # fmt: skip


def test_staleness_zero_one_worker_is_the_thread_run_bit_for_bit(local_cluster):
    runs = {}
    for backend in ("thread", "ray"):
        args = ppo.Args(total_timesteps=8 * 128 * 4, backend=backend, seed=5, **FAST)
        runs[backend] = ppo.train(args)
    thread, on_ray = runs["thread"], runs["ray"]
    assert [c[2] for c in thread.curve] == [c[2] for c in on_ray.curve]
    for name, value in thread.policy["state_dict"].items():
        assert torch.equal(value, on_ray.policy["state_dict"][name]), name


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_two_workers_every_chunk_once_within_the_staleness_bound(local_cluster, staleness):
    with _runtime(2, staleness) as runtime:
        for _ in range(12):
            slot, chunk = runtime.next_chunk()
            assert 0 <= runtime.lag(chunk) <= staleness
            assert chunk.obs.abs().sum() > 0
            runtime.release(slot)
            runtime.publish(runtime._template)
        trained = runtime.trained
    assert len(set(trained)) == len(trained) == 12  # no chunk twice
    for worker in (0, 1):  # each worker's chunks in order, none skipped
        seqs = [seq for w, seq in trained if w == worker]
        assert seqs == list(range(len(seqs))) and seqs, (worker, trained)


def test_weights_reach_the_workers_once_per_version(local_cluster):
    """A worker is sent a version's weights only when it is behind it; the chunk it fills is
    tagged with the version it holds."""
    with _runtime(2, 1) as runtime:
        template = runtime._template
        for version in range(1, 6):
            slot, chunk = runtime.next_chunk()
            runtime.release(slot)
            with torch.no_grad():
                for p in template.parameters():
                    p.add_(0.01)
            runtime.publish(template)
        sent_refs = runtime._weights_ref
        assert runtime._weights_version == 5 and sent_refs is not None


def test_a_killed_worker_loses_its_chunk_which_is_counted_and_the_run_goes_on(local_cluster):
    with _runtime(2, 1, max_restarts=2) as runtime:
        for _ in range(3):
            slot, _chunk = runtime.next_chunk()
            runtime.release(slot)
            runtime.publish(runtime._template)
        pid, _node = ray.get(runtime.workers[0].where.remote())
        os.kill(pid, signal.SIGKILL)
        start = time.perf_counter()
        for _ in range(10):
            slot, _chunk = runtime.next_chunk()
            runtime.release(slot)
            runtime.publish(runtime._template)
        assert time.perf_counter() - start < 60
        assert runtime.loss.dropped >= 1
        assert all("worker 0" in cause for cause in runtime.loss.causes), runtime.loss.causes
        trained = runtime.trained
        assert len(set(trained)) == len(trained) == 13
        new_pid, _ = ray.get(runtime.workers[0].where.remote())
        assert new_pid != pid  # restarted by Ray


def test_more_workers_than_the_cluster_can_place_fail_at_once(local_cluster):
    start = time.perf_counter()
    with pytest.raises(ValueError, match="3 workers x 1 CPUs need 3 CPUs; the Ray cluster has 2"):
        _runtime(3, 0).start()
    assert time.perf_counter() - start < 5


def test_a_worker_whose_env_raises_stops_the_run_with_the_cause(local_cluster):
    args = appo.Args(env_id="tests.algos.custom_envs:FailingEnv", backend="ray",
                     total_timesteps=4096, num_envs=1, num_steps=64, **FAST)  # fmt: skip
    with pytest.raises(RuntimeError, match="the simulator diverged"):
        appo.train(args)


def test_appo_on_two_workers_learns_and_the_report_counts_no_drops(local_cluster, tmp_path):
    from nostall.cli import main

    code = main(["train", "appo", "--env", "CartPole-v1", "--backend", "ray", "--num-workers",
                 "2", "--total-timesteps", "40000", "--no-progress", "--no-watch-syncs",
                 "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    import json

    report = json.loads((tmp_path / "report.json").read_text())
    assert report["dropped_chunks"] == 0
    assert report["final_return"] > 100, report  # random play: about 20


def test_checkpoints_are_refused_with_the_ray_backend():
    with pytest.raises(ValueError, match="checkpoints are not supported with --backend ray"):
        ppo.Args(backend="ray", checkpoint="ckpt-{iteration}.pt").check()
    with pytest.raises(ValueError, match="num_workers > 1 needs --backend ray"):
        ppo.Args(num_workers=2).check()
