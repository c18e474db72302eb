"""The trainer on a GPU, the rollout side on the CPU: chunks go to the device and weights come
back without the trainer's host thread waiting for the device.

- A chunk (collected into pinned host memory) is copied into a device chunk with non-blocking
  copies on a copy stream; the trainer's stream waits for them on the device, not the host.
  The host slot is handed back to the rollout side once the copies are done, which the host
  checks at the end of the iteration, long after they finished.
- Weights are published into pinned host buffers by non-blocking copies on the trainer's
  stream, with an event the rollout side waits on before it loads them: the rollout side waits
  for the weights it needs, the trainer for nothing.
On the CPU every piece is a plain copy (or none), so the same trainer code runs everywhere.
"""

from __future__ import annotations

import torch

from nostall.runtime.storage import Chunk


def pinned(device: torch.device) -> bool:
    """Whether host buffers feeding `device` should be pinned (page-locked)."""
    return device.type == "cuda"


class DeviceChunks:
    """Copies host chunks into two alternating device chunks, on a stream of its own: chunk k's
    copy waits only for the update of chunk k - 2 (the last reader of its device buffer), so
    the copy and the previous update overlap and `wait_copied` never waits for an update."""

    def __init__(self, like: Chunk, device: torch.device):
        self.device = device
        self.on_device = device.type != "cpu"
        if self.on_device:
            self._chunks = [
                Chunk(**{k: torch.empty_like(v, device=device) for k, v in like.tensors().items()})
                for _ in range(2)
            ]
            self._copy_stream = torch.cuda.Stream(device)
            self._copied = [torch.cuda.Event() for _ in range(2)]
            self._consumed = [torch.cuda.Event() for _ in range(2)]
            self._next = 0

    def to_device(self, chunk: Chunk) -> Chunk:
        """The chunk on the device, ready in the current stream's order (on the CPU: itself).
        Call `wait_copied` after queueing the update that reads it."""
        if not self.on_device:
            return chunk
        i = self._next
        compute = torch.cuda.current_stream(self.device)
        target = self._chunks[i]
        # The update that last read this buffer (two chunks ago) must be done with it.
        self._copy_stream.wait_event(self._consumed[i])
        with torch.cuda.stream(self._copy_stream):
            for name, source in chunk.tensors().items():
                getattr(target, name).copy_(source, non_blocking=True)
            self._copied[i].record(self._copy_stream)
        compute.wait_event(self._copied[i])
        target.version = chunk.version
        return target

    def wait_copied(self) -> None:
        """After the update on the chunk was queued: marks its device buffer's last reader, and
        waits (on the host) until the host chunk's copies are done, before the host chunk is
        reused; they finished long ago."""
        if self.on_device:
            i = self._next
            self._consumed[i].record(torch.cuda.current_stream(self.device))
            self._next = 1 - i
            self._copied[i].synchronize()  # sync: the copies only, not the update


class HostWeights:
    """One half of a weight double buffer on the host, filled from device weights without a
    host wait: `fill` queues the copies and records an event, `ready` waits for it (the
    rollout side, before it loads the weights)."""

    def __init__(self, state: dict[str, torch.Tensor]):
        devices = {v.device for v in state.values()}
        self.from_device = any(d.type == "cuda" for d in devices)
        self._device = next((d for d in devices if d.type == "cuda"), None)
        self.tensors = {
            k: torch.empty(v.shape, dtype=v.dtype, pin_memory=self.from_device)
            for k, v in state.items()
        }
        self._event = torch.cuda.Event() if self.from_device else None
        self.fill(state)
        self.ready()

    def fill(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():  # one call for every tensor (a copy each cost ~4 us of glue)
            torch._foreach_copy_(
                [self.tensors[k] for k in state],
                list(state.values()),
                non_blocking=self.from_device,
            )
        if self._event is not None:
            # On the stream that queued the copies: the current stream of the weights' device
            # (not of whatever device is current).
            self._event.record(torch.cuda.current_stream(self._device))

    def ready(self) -> dict[str, torch.Tensor]:
        if self._event is not None:
            self._event.synchronize()  # sync: the rollout side waits for the weights it loads
        return self.tensors
