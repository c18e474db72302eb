"""Weight sync without stopping the world: the trainer publishes its weights into one half of a
double buffer; the rollout side copies the newest half into its own policy copy at a chunk
boundary. Neither side waits for the other's compute, only for a short copy under a lock.

The trainer's progress (updates done) is tracked apart from the weights' version, so it may
publish weights only every K updates while the staleness bound still counts updates. The
buffers live on the host: with the trainer on a GPU, publishing queues non-blocking copies
(see device.py) that the rollout side waits for before it loads them."""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch

from nostall.runtime.device import HostWeights

# Each module's state-dict tensors, found once (see state_tensors).
_STATE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def state_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`module.state_dict()`'s tensors by name, without walking the module tree each time (a
    `transformers` model's state_dict took about 0.2 ms, on the trainer's path every update).

    Cached when the state dict is all parameters: their objects stay valid when an optimizer
    re-points their `.data` (as ClippedAdam does). A module with persistent buffers, which may
    be reassigned, gets a fresh state_dict each call."""
    cached = _STATE.get(module)
    if cached is None:
        state = module.state_dict(keep_vars=True)
        if not all(isinstance(v, torch.nn.Parameter) for v in state.values()):
            return module.state_dict()
        cached = _STATE[module] = state
    return cached


class WeightBuffer:
    def __init__(self, module: torch.nn.Module):
        self._buffers = [HostWeights(module.state_dict()) for _ in range(2)]
        self._versions = [0, -1]
        self._newest = 0
        self._progress = 0  # updates the trainer has done
        self._reading = [0, 0]  # rollout-side copies in progress from each half
        self._lock = threading.Lock()
        self._published = threading.Condition(self._lock)

    @property
    def version(self) -> int:
        with self._lock:
            return self._versions[self._newest]

    def publish(self, module: torch.nn.Module, version: int) -> None:
        """Copies `module`'s weights in as `version` (the trainer side)."""
        self.publish_state(state_tensors(module), version)

    def publish_state(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copies a state dict (the trainer's, or a checkpoint's) in as `version`. Waits only
        in the rare case that the rollout side is still reading the spare half (two publishes
        during one of its pulls)."""
        with self._lock:
            spare = 1 - self._newest
            while self._reading[spare]:
                self._published.wait(timeout=0.05)
        self._buffers[spare].fill(state)
        with self._lock:
            self._versions[spare] = version
            self._newest = spare
            self._progress = max(self._progress, version)
            self._published.notify_all()

    def newest(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """The newest published weights: a copy, or (copy=False) the buffer itself, valid until
        the next publish."""
        with self._lock:
            ready = self._buffers[self._newest].ready()
            return {k: v.clone() for k, v in ready.items()} if copy else dict(ready)

    def advance(self, version: int) -> None:
        """Records that the trainer reached `version` without publishing its weights."""
        with self._lock:
            self._progress = max(self._progress, version)
            self._published.notify_all()

    def pull(self, module: torch.nn.Module, have: int) -> int:
        """Loads the newest weights into `module` if newer than version `have`; returns the
        version `module` now holds (the rollout side)."""
        with self._lock:
            newest = self._newest
            version = self._versions[newest]
            if version <= have:
                return have
            self._reading[newest] += 1
        try:
            # Outside the lock: waiting for a GPU trainer's copies must not hold up its publish.
            weights = self._buffers[newest].ready()
            with torch.no_grad():
                targets = state_tensors(module)
                torch._foreach_copy_(list(targets.values()), [weights[k] for k in targets])
        finally:
            with self._lock:
                self._reading[newest] -= 1
                self._published.notify_all()
        return version

    def release(self) -> None:
        """(SharedWeights' interface: the rollout side reads its own copy, held by nobody.)"""

    def writing(self) -> contextlib.AbstractContextManager:
        """(SharedWeights' interface: the trainer's writes touch no weights the rollout side
        reads.)"""
        return contextlib.nullcontext()

    def wait_for(self, version: int, stop: threading.Event, poll_s: float = 0.05) -> None:
        """Blocks until the trainer reached `version` (or newer), or `stop` is set."""
        with self._lock:
            while self._progress < version and not stop.is_set():
                self._published.wait(timeout=poll_s)
