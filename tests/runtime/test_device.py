"""The trainer-device hand-off: chunks to the device and weights back to the host (on the CPU
a pass-through and a plain copy; the CUDA tests need a GPU)."""

import pytest
import torch

from nostall.runtime.device import DeviceChunks, HostWeights, pinned
from nostall.runtime.storage import Chunk


def _chunk(pin_memory=False):
    chunk = Chunk.empty(4, 3, 2, (), True, pin_memory=pin_memory)
    g = torch.Generator().manual_seed(0)
    for t in chunk.tensors().values():
        t.copy_(torch.randint(0, 2, t.shape, generator=g).to(t.dtype))
    chunk.version = 7
    return chunk


def test_on_the_cpu_chunks_pass_through_and_weights_are_copied():
    chunk = _chunk()
    mover = DeviceChunks(chunk, torch.device("cpu"))
    assert mover.to_device(chunk) is chunk
    mover.wait_copied()
    state = {"w": torch.randn(3, 2), "b": torch.randn(3)}
    host = HostWeights(state)
    state["w"].add_(1.0)
    assert not torch.equal(host.ready()["w"], state["w"])  # a copy, not an alias
    host.fill(state)
    torch.testing.assert_close(host.ready()["w"], state["w"], rtol=0, atol=0)
    assert not pinned(torch.device("cpu")) and pinned(torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
def test_chunks_reach_the_device_and_weights_the_host_without_a_host_wait():
    device = torch.device("cuda")
    chunk = _chunk(pin_memory=True)
    mover = DeviceChunks(chunk, device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_device = mover.to_device(chunk)
        doubled = on_device.obs * 2  # ordered after the copies on the current stream
    finally:
        torch.cuda.set_sync_debug_mode(0)
    mover.wait_copied()
    assert on_device.version == 7 and on_device.obs.device.type == "cuda"
    for name, t in chunk.tensors().items():
        torch.testing.assert_close(getattr(on_device, name).cpu(), t, rtol=0, atol=0)
    torch.testing.assert_close(doubled.cpu(), chunk.obs * 2)
    state = {"w": torch.randn(64, 64, device=device)}
    host = HostWeights(state)
    assert host.tensors["w"].is_pinned()
    state["w"].mul_(3.0)
    host.fill(state)
    torch.testing.assert_close(host.ready()["w"], state["w"].cpu(), rtol=0, atol=0)
