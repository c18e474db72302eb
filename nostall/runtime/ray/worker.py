"""One RayLoop worker (a Ray actor, ray_loop.py): it builds its rollout side from a picklable
recipe, fills its own slot with the policy version it is asked for, and returns the slot's
tensors as NumPy arrays, which Ray's object store hands to the trainer without a copy."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from nostall.runtime.protocol import fill_chunk
from nostall.runtime.watchdog import Watchdog, run_watched


def ray_module():
    try:
        import ray
    except ImportError as e:
        raise ValueError("--backend ray needs Ray: pip install 'ray==2.58.0'") from e
    return ray


def as_array(tensor: torch.Tensor) -> np.ndarray:
    """A host tensor's numpy view (bfloat16, which numpy lacks, as its raw 16-bit words)."""
    tensor = tensor.detach()
    raw = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
    return raw.numpy()  # sync: none, a host tensor (numpy() refuses a device one)


def to_arrays(state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(numpy arrays, dtypes) of a state dict, copied to the host: what the object store takes,
    and what `from_array` needs to read them back."""
    # sync: the weights to the host once a version (the Ray backend's trainer is on the CPU:
    # no copy then)
    host = {k: v.detach().cpu() for k, v in state.items()}
    return {k: as_array(v) for k, v in host.items()}, {k: v.dtype for k, v in host.items()}


def from_array(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `dtype` holding a copy of `as_array`'s array."""
    tensor = torch.from_numpy(np.array(array))
    return tensor.view(dtype) if dtype == torch.bfloat16 else tensor


def copy_numpy(tensors: dict[str, torch.Tensor], arrays: dict[str, np.ndarray]) -> None:
    """Copies arrays (read-only views of the object store) into tensors of the same names and
    shapes: host ones in place, device ones (a GPU run's slots and worker models) through a
    host copy."""
    for name, tensor in tensors.items():
        if tensor.device.type == "cpu":
            np.copyto(as_array(tensor), arrays[name])  # sync: none, host tensors
        else:  # sync: a chunk or a version's weights onto the device, once each
            tensor.copy_(from_array(arrays[name], tensor.dtype))


def _empty_like(slot: Any, device: torch.device | str = "cpu") -> Any:
    """A slot of the same layout with its own storage on `device` (for a worker)."""
    import copy

    fresh = copy.copy(slot)
    for name, tensor in slot.tensors().items():
        setattr(fresh, name, torch.zeros_like(tensor, device=device))
    return fresh


class Worker:
    """One rollout worker (a Ray actor): its side, its slot, the weights version it holds."""

    def __init__(
        self,
        make_side: Callable,
        worker: int,
        slot: Any,
        torch_threads: int,
        restartable: bool = True,
    ):
        torch.set_num_threads(torch_threads)
        self.worker = worker
        self.side = make_side(worker)
        if hasattr(self.side, "watchdog"):  # its steps' limits, checked around each fill
            self.side.watchdog = Watchdog()
        # On the device the side fills from (a GPU generator's batches: its own GPU).
        self.slot = _empty_like(slot, getattr(self.side, "slot_device", "cpu"))
        self.version = -1  # the side's own initial weights, not yet any published version
        self.receiver = None  # with weights="collective": collective_weights.Receiver
        # Why the side's state cannot be taken, once known; a worker Ray never restarts (the
        # collective broadcast) needs none taken after each fill.
        self.unsaved: str | None = None if restartable else "the worker is not restarted"

    def join_weights(self, host: str, port: int, world: int, device: str) -> int:
        """Joins the trainer's weight broadcast (weights="collective") as rank worker + 1."""
        from nostall.runtime.ray.collective_weights import Receiver, flat_size

        model = self.side.model
        self.receiver = Receiver(
            host, port, self.worker + 1, world, flat_size(model), torch.device(device)
        )
        return self.worker

    def ready(self) -> int:
        return self.worker

    def where(self) -> tuple[int, str]:
        """(process id, Ray node id): for tests and diagnostics."""
        return os.getpid(), ray_module().get_runtime_context().get_node_id()

    def fill(self, seq: int, version: int, weights) -> dict:
        """Fills the slot with the policy of `version` (`weights` None: already held) and
        returns its tensors as NumPy arrays (zero-copy in the store) and its host state."""

        def pull() -> int:
            if self.receiver is not None:
                if self.version < version:  # the broadcast of `version`, exactly
                    self.receiver.load(self.side.model, version)
            elif weights is not None:
                copy_numpy(self.side.model.state_dict(), weights)
            self.version = version
            return version

        # Wall-clock times: the driver compares them across processes.
        # In a thread of its own while this one watches its steps: a hung reward function
        # comes back as this call's error, naming it.
        _, start, end = run_watched(
            lambda: fill_chunk(self.side, self.slot, pull, clock=time.time),
            getattr(self.side, "watchdog", None),
        )
        stats = self.side.stats() if hasattr(self.side, "stats") else {}
        return {
            "worker": self.worker,
            "seq": seq,
            "version": version,
            "start": start,
            "end": end,
            # (A host slot's tensors as they are; a device slot's copied to the host.)
            "tensors": {
                k: v.cpu().numpy()  # sync: a device slot's chunk, once a fill
                for k, v in self.slot.tensors().items()
            },
            "host": self.slot.host_state(),
            "stats": stats,
            "side": self._side_state(),
            "side_unsaved": self.unsaved,
        }

    def _side_state(self) -> dict | None:
        """The side's state after this fill (its prompt and environment streams, its sampling
        generator: bytes to kilobytes, small beside the chunk), which the driver keeps so that,
        should this actor die and Ray restart it, its streams go on from here. None for a side
        that cannot be saved (an EnvPool environment), tried once."""
        if self.unsaved is None:
            try:
                return self.side.state_dict()
            except ValueError as e:  # the side's own message: what it holds that cannot be
                self.unsaved = str(e)
        return None

    def restore_side(self, state: dict) -> None:
        """After Ray restarted this actor: its side's streams as they stood (`_side_state`)."""
        self.side.load_state_dict(state)

    def state(self) -> dict:
        """Between fills (actor calls run in order): what resumes this worker exactly."""
        model = self.side.model
        # On the host: a checkpoint loads on any machine.
        weights = {
            k: v.detach().cpu().clone()  # sync: a checkpoint's, between fills
            for k, v in model.state_dict().items()
        }
        return {
            "side": self.side.state_dict(),
            "rollout_weights": weights,
            "rollout_version": max(self.version, 0),
        }

    def load(self, state: dict) -> None:
        if state.get("side"):
            self.side.load_state_dict(state["side"])
        with torch.no_grad():
            for name, value in self.side.model.state_dict().items():
                value.copy_(state["rollout_weights"][name])
        self.version = int(state["rollout_version"])
