"""The stream-ordered environment step with CUDA actions."""

import numpy as np
import pytest
import torch

import nostall
import nostall.envs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present"),
]


def _pair(env_id="CartPole-v1", n=16):
    a = nostall.envs.make(env_id, n, seed=1)
    b = nostall.envs.make(env_id, n, seed=1)
    a.torch.reset()
    b.torch.reset()
    return a, b


def test_cuda_step_equals_cpu_step_and_stays_on_the_device():
    cpu_env, gpu_env = _pair()
    for k in range(20):
        actions = torch.tensor([(k + i) % 2 for i in range(16)])
        want = cpu_env.torch.step(actions)
        got = gpu_env.torch.step(actions.cuda())
        assert got.obs.is_cuda and got.reward.is_cuda
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


def test_cuda_step_never_blocks_the_host():
    env = nostall.envs.make("Pendulum-v1", 64, seed=0)
    env.torch.reset()
    actions = torch.zeros(64, 1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            step = env.torch.step(actions)
            actions = step.obs[:, :1] * 0.5  # the policy reads the device outputs
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_cuda_graph_capture_replays_steps():
    cpu_env, gpu_env = _pair("CartPole-v1", 8)
    actions = torch.ones(8, dtype=torch.long, device="cuda")
    gpu_env.torch.step(actions)  # warm up staging outside the capture
    cpu_env.torch.step(actions.cpu())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = gpu_env.torch.step(actions)
    for _ in range(3):
        graph.replay()
        want = cpu_env.torch.step(actions.cpu())
        torch.cuda.synchronize()
        torch.testing.assert_close(captured.obs.cpu(), want.obs, rtol=0, atol=0)


def test_bad_action_on_the_stream_is_raised_by_the_next_call():
    env = nostall.envs.make("CartPole-v1", 4, seed=0)
    env.torch.reset()
    env.torch.step(torch.tensor([0, 5, 0, 0], device="cuda"))
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="actions must lie in \\[0, 2\\), got 5"):
        env.torch.step(torch.zeros(4, dtype=torch.long, device="cuda"))
    step = env.torch.step(torch.zeros(4, dtype=torch.long, device="cuda"))
    assert np.isfinite(step.obs.cpu().numpy()).all()
