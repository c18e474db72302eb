"""Published weights broadcast to every Ray worker by a collective (`RayLoop(...,
weights="collective")`): gloo between CPUs, NCCL between GPUs, instead of one `ray.put` per
version read by each worker from the object store. On GPUs this keeps the weights on the
devices (no host round trip); the interface and the versions are the store's.

The trainer is rank 0 of a process group of its own (a TCPStore and a ProcessGroupGloo or
ProcessGroupNCCL, not torch.distributed's default group, which data-parallel trainer ranks
use). Each published version is one flat buffer [version, weights...], broadcast in order by a
sender thread, so `publish` never waits for a worker. Each worker receives every broadcast in
a thread of its own into a double buffer; a fill asked for version v waits until it holds v or
newer. A failure on either side is raised at the next publish or fill, with its cause."""

from __future__ import annotations

import datetime
import queue
import threading

import torch
import torch.distributed as dist

JOIN_TIMEOUT_S = 60.0


def flat_size(model: torch.nn.Module) -> int:
    return sum(v.numel() for v in model.state_dict().values())


def _group(host: str, port: int, rank: int, world: int, device: torch.device):
    store = dist.TCPStore(host, port, world, rank == 0,
                          timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))  # fmt: skip
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(store, rank, world)
    return dist.ProcessGroupGloo(store, rank, world)


def _broadcast(group, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


class Sender:
    """Rank 0: broadcasts each published version, in order, from a thread."""

    def __init__(self, host: str, port: int, world: int, device: torch.device):
        self.device = device
        self._group = _group(host, port, 0, world, device)  # returns once all have joined
        self._queue: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nostall-weights", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (flat := self._queue.get()) is not None:
                _broadcast(self._group, flat)
        except BaseException as e:  # reported at the next publish
            self.error = e

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Queues a state dict (the model's, in its order) as `version`; returns at once."""
        if self.error is not None:
            raise RuntimeError(f"the weight broadcast failed: {self.error!r}") from self.error
        with torch.no_grad():
            values = [v.detach().reshape(-1).to(self.device, torch.float32)
                      for v in state.values()]  # fmt: skip
            version_slot = torch.full((1,), float(version), device=self.device)
            self._queue.put(torch.cat([version_slot, *values]))  # a copy the thread owns

    def close(self) -> None:
        self._queue.put(None)


class Receiver:
    """A worker (rank r > 0): receives every broadcast into a double buffer from a thread;
    `load(model, version)` waits until it holds `version` or newer and loads it."""

    def __init__(self, host: str, port: int, rank: int, world: int, numel: int,
                 device: torch.device):  # fmt: skip
        self._group = _group(host, port, rank, world, device)
        self._buffers = [torch.empty(1 + numel, device=device) for _ in range(2)]
        self._newest = -1  # which buffer holds the newest version (-1: none yet)
        self._version = -1
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nostall-weights", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                target = 0 if self._newest < 0 else 1 - self._newest  # not the one loads read
                _broadcast(self._group, self._buffers[target])
                with self._cond:
                    self._newest = target
                    # sync: the version number, once per broadcast, in this receiving thread
                    self._version = int(self._buffers[target][0])
                    self._cond.notify_all()
        except BaseException as e:
            with self._cond:
                self.error = e
                self._cond.notify_all()

    def load(self, model: torch.nn.Module, version: int, timeout_s: float = JOIN_TIMEOUT_S) -> int:
        """Loads the newest received weights once they are at least `version`; returns the
        version loaded. The buffer is read under the lock, so the next broadcast (into the
        other buffer) cannot overwrite it meanwhile."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._version >= version or self.error, timeout_s)
            if self.error is not None:
                raise RuntimeError(f"the weight broadcast failed: {self.error!r}") from self.error
            if not ok:
                raise RuntimeError(f"weights of version {version} did not arrive within "
                                   f"{timeout_s:.0f} s")  # fmt: skip
            flat, offset = self._buffers[self._newest], 1
            with torch.no_grad():
                for value in model.state_dict().values():
                    n = value.numel()
                    value.copy_(flat[offset : offset + n].view_as(value))
                    offset += n
            return self._version
