"""The process transport's weights: one shared-memory copy of the trainer's newest published
weights with its version, the trainer's progress and the child's pulls beside it, under a lock
each side waits for only while the other lives (a multi-GB copy is progress, not silence)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from nostall.runtime.process.child import POLL_S


class SharedWeights:
    """The published weights in shared memory, their version and the trainer's progress."""

    def __init__(self, ctx, module: torch.nn.Module):
        self.tensors = {
            k: v.detach().to("cpu", copy=True).share_memory_()
            for k, v in module.state_dict().items()
        }
        self.version = ctx.Value("q", 0)  # the version of the weights in `tensors`
        self.progress = ctx.Value("q", 0)  # updates the trainer has done
        self.pulls = ctx.Value("q", 0)  # weight checks the child has made (one per chunk)
        self.limit = ctx.Value("q", 0)  # chunks the trainer will take in all (0: no end)
        self.lock = ctx.Lock()

    @contextlib.contextmanager
    def locked(self, alive: Callable[[], None]):
        """The lock, waited for in slices with `alive()` called at each: it raises when the other
        side died (it may have died holding the lock) or went silent, so no wait is ever bounded
        by a guess of how long a copy takes. The trainer passes the child's check (its exit, its
        error, its heartbeat, which `pull` keeps beating between tensors); the child passes its
        heartbeat (which raises when the trainer is gone)."""
        while not self.lock.acquire(timeout=POLL_S):
            alive()
        try:
            yield
        finally:
            self.lock.release()

    def pull(
        self,
        module: torch.nn.Module,
        have: int,
        alive: Callable[[], None],
        at_chunk_start: bool = False,
    ) -> int:
        """The child's side: loads the published weights if newer than `have` (counted in
        `pulls` at a chunk's start, not in flight)."""
        with self.locked(alive):
            self.pulls.value += at_chunk_start
            if self.version.value > have:
                with torch.no_grad():
                    for name, value in module.state_dict().items():
                        value.copy_(self.tensors[name])
                        alive()  # a large model's copy is progress, not silence
                have = self.version.value
            return have
