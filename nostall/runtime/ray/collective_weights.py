"""Published weights broadcast to every Ray worker by a collective (`RayOptions(
weights="collective")`): gloo between CPUs, NCCL between GPUs, instead of one `ray.put` per
version read by each worker from the object store. On GPUs this keeps the weights on the
devices (no host round trip); the interface and the versions are the store's.

The trainer is rank 0 of a process group of its own (a TCPStore and a ProcessGroupGloo or
ProcessGroupNCCL, not torch.distributed's default group, which data-parallel trainer ranks
use). Each published version is one flat buffer [version, weights...], broadcast in order by a
sender thread, so `publish` never waits for a worker. Each worker receives every broadcast in
a thread of its own, one buffer a version; a fill asked for version v waits until it holds v
and loads exactly v, as the store's fills do (a broadcast that ran ahead of the fills keeps its
buffer for the fill that asks for it), so both transports train the same run. A worker's fills
ask for versions in order, so the buffers of versions older than its last load are reused. A
failure on either side is raised at the next publish or fill, with its cause."""

from __future__ import annotations

import datetime
import queue
import threading

import torch
import torch.distributed as dist

JOIN_TIMEOUT_S = 60.0


def flat_size(model: torch.nn.Module) -> int:
    return sum(v.numel() for v in model.state_dict().values())


def _group(store: dist.TCPStore, rank: int, world: int, device: torch.device):
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(store, rank, world)
    return dist.ProcessGroupGloo(store, rank, world)


def _broadcast(group, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


class Sender:
    """Rank 0: broadcasts each published version, in order, from a thread."""

    def __init__(self, store: dist.TCPStore, world: int, device: torch.device):
        """`store`: distributed.open_store's, whose port the workers were given."""
        self.device = device
        self._group = _group(store, 0, world, device)  # returns once all have joined
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
            values = [v.detach().reshape(-1).to(self.device, torch.float32) for v in state.values()]
            version_slot = torch.full((1,), float(version), device=self.device)
            self._queue.put(torch.cat([version_slot, *values]))  # a copy the thread owns

    def close(self) -> None:
        self._queue.put(None)


class Receiver:
    """A worker (rank r > 0): receives every broadcast from a thread, one buffer a version;
    `load(model, version)` waits until it holds `version` and loads exactly it."""

    def __init__(
        self, host: str, port: int, rank: int, world: int, numel: int, device: torch.device
    ):
        store = dist.TCPStore(
            host, port, world, False, timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S)
        )
        self._group = _group(store, rank, world, device)
        self._shape, self._device = (1 + numel,), device
        # Versions received and not yet passed by a load, and buffers free for the next ones:
        # a broadcast runs at most `staleness + 1` versions ahead of this worker's fills.
        self._received: dict[int, torch.Tensor] = {}
        self._spare: list[torch.Tensor] = []
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nostall-weights", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    spare = self._spare.pop() if self._spare else None
                buffer = torch.empty(self._shape, device=self._device) if spare is None else spare
                _broadcast(self._group, buffer)  # (into a buffer no load reads)
                with self._cond:
                    # sync: the version number, once per broadcast, in this receiving thread
                    self._received[int(buffer[0])] = buffer
                    self._cond.notify_all()
        except BaseException as e:
            with self._cond:
                self.error = e
                self._cond.notify_all()

    def load(self, model: torch.nn.Module, version: int, timeout_s: float = JOIN_TIMEOUT_S) -> int:
        """Loads the weights of `version` once received; returns it. The buffers of older
        versions are freed: this worker's later fills ask for `version` or newer."""
        with self._cond:
            ok = self._cond.wait_for(lambda: version in self._received or self.error, timeout_s)
            if self.error is not None:
                raise RuntimeError(f"the weight broadcast failed: {self.error!r}") from self.error
            if not ok:
                raise RuntimeError(
                    f"weights of version {version} did not arrive within {timeout_s:.0f} s"
                )
            flat, offset = self._received[version], 1
            with torch.no_grad():
                for value in model.state_dict().values():
                    n = value.numel()
                    value.copy_(flat[offset : offset + n].view_as(value))
                    offset += n
            for older in [v for v in self._received if v < version]:
                self._spare.append(self._received.pop(older))
            return version
