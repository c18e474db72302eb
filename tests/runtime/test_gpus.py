"""No NCCL peer of the driver is put on the driver's GPU: a local Ray cluster started with the
driver's GPU hidden assigns its actors the others (Ray's GPU ids, given without GPUs, as a
CPU machine can test them), and two ranks on one GPU are named before NCCL's first collective."""

import os

import pytest
import torch

from nostall.runtime.gpus import (
    check_distinct,
    check_fits,
    hidden_from_ray,
    physical_gpu,
    visible_gpus,
)

ray = pytest.importorskip("ray", reason="Ray (a dev dependency) is not installed")


def test_the_driver_gpu_is_named_as_the_environment_names_it(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_gpus() == ["3", "5"]
    assert physical_gpu(torch.device("cuda", 1)) == "5"
    assert physical_gpu(torch.device("cpu")) is None
    with pytest.raises(ValueError, match=r"cuda:2 is not among this process's GPUs"):
        physical_gpu(torch.device("cuda", 2))


def test_hiding_lasts_for_the_block_alone(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    with hidden_from_ray("1"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with hidden_from_ray(None):
        assert "CUDA_VISIBLE_DEVICES" not in os.environ


@ray.remote(num_gpus=1, num_cpus=0)
class _Holder:
    def gpus(self) -> list[str]:
        return [str(g) for g in ray.get_gpu_ids()]


def test_a_cluster_started_without_the_driver_gpu_never_assigns_it(monkeypatch):
    if ray.is_initialized():
        pytest.skip("a Ray cluster is up already: this test starts its own")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    with hidden_from_ray("0"):
        ray.init(num_cpus=1, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        holders = [_Holder.remote() for _ in range(2)]
        assigned = [g for gpus in ray.get([h.gpus.remote() for h in holders]) for g in gpus]
        assert sorted(assigned) == ["1", "2"]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2"  # (the driver's own, restored)
    finally:
        ray.shutdown()


def test_two_ranks_on_one_gpu_are_named():
    check_distinct(["GPU-a", "GPU-b", "GPU-c"])
    with pytest.raises(RuntimeError, match=r"ranks 0 and 2 are on one GPU \(GPU-a\)"):
        check_distinct(["GPU-a", "GPU-b", "GPU-a"])


def test_a_shortfall_names_what_needs_it_and_what_the_cluster_has():
    each = {"num_cpus": 2.0, "num_gpus": 0.5}
    check_fits({"CPU": 4.0, "GPU": 1.0}, each, 2, "2 workers")  # fits exactly
    with pytest.raises(
        ValueError,
        match=r"^3 workers x 2 CPUs need 6 CPUs; the Ray cluster "
        r"has 4 free$",
    ):
        check_fits({"CPU": 4.0, "GPU": 2.0}, each, 3, "3 workers", " free")
    with pytest.raises(ValueError, match=r"x 0.5 GPUs need 1 GPUs; the Ray cluster has 0$"):
        check_fits({"CPU": 8.0}, each, 2, "2 workers")
