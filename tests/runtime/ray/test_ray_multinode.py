"""The Ray backend on a cluster of several nodes (each its own raylet, on this machine):
workers are spread over the nodes and the run trains as on one."""

import pytest

from nostall.algos import appo

ray = pytest.importorskip("ray", reason="Ray (a dev dependency) is not installed")
from ray.cluster_utils import Cluster  # noqa: E402

from nostall.runtime.ray.loop import RayLoop  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_workers_spread_over_two_nodes_and_every_chunk_is_trained_once(two_nodes, monkeypatch):
    runtimes = []
    real_start = RayLoop.start

    def start(self):
        runtimes.append(self)
        return real_start(self)

    monkeypatch.setattr(RayLoop, "start", start)
    args = appo.APPOConfig(
        backend="ray",
        num_workers=2,
        total_timesteps=8 * 128 * 10,
        watch_syncs=False,
        log_interval=1,
    )
    nodes = set()

    def log(steps, metrics):
        if not nodes:
            nodes.update(
                node for _, node in ray.get([w.where.remote() for w in runtimes[0].workers])
            )

    result = appo.train(args, log=log)
    assert len(nodes) == 2  # one worker a node: each node has one CPU
    trained = runtimes[0].trained
    assert len(set(trained)) == len(trained) == 10
    assert result.dropped_chunks == 0 and result.steps == 8 * 128 * 10
