"""CUDA-only behaviour of the advantage ops: the kernels run on the caller's current stream and
never synchronise with the host."""

import pytest
import torch

import nostall
from tests.ops.rollouts import make_rollout

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present"),
]


def test_cuda_kernels_are_loaded():
    assert nostall.HAS_CUDA_KERNELS


def test_no_host_sync_in_any_op():
    ro = make_rollout(512, 256, torch.float32, seed=1).to("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        nostall.gae(ro.reward, ro.value, ro.next_value, ro.done, ro.terminated)
        nostall.discounted_returns(ro.reward, ro.done, ro.terminated, ro.next_value)
        nostall.vtrace(
            ro.behavior_log_prob,
            ro.target_log_prob,
            ro.reward,
            ro.value,
            ro.next_value,
            ro.done,
            ro.terminated,
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_runs_on_the_current_stream():
    ro = make_rollout(2048, 64, torch.float32, seed=2).to("cuda")
    want = nostall.gae(ro.reward, ro.value, ro.next_value, ro.done, ro.terminated)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = nostall.gae(ro.reward, ro.value, ro.next_value, ro.done, ro.terminated)
        done_event = torch.cuda.Event()
        done_event.record(side)
    done_event.synchronize()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_cuda_agrees_with_cpu_at_benchmark_size():
    ro = make_rollout(2048, 1024, torch.float32, seed=3)
    args = (ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.99, 0.95)
    cpu = nostall.gae(*args)
    gpu = nostall.gae(*(a.cuda() if isinstance(a, torch.Tensor) else a for a in args))
    for c, g in zip(cpu, gpu, strict=True):
        torch.testing.assert_close(g.cpu(), c, rtol=1e-5, atol=1e-5)


def test_cuda_graph_capture():
    ro = make_rollout(128, 64, torch.float32, seed=4).to("cuda")
    args = (ro.reward, ro.value, ro.next_value, ro.done, ro.terminated, 0.99, 0.95)
    want = nostall.gae(*args)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = nostall.gae(*args)
    graph.replay()
    torch.cuda.synchronize()
    for c, w in zip(captured, want, strict=True):
        torch.testing.assert_close(c, w, rtol=0, atol=0)
