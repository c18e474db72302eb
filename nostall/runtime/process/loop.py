"""RolloutLoop with the rollout side in a process of its own: the same trainer-facing interface
(next_chunk, release, publish, lag, boundary, state_dict), for any fill, so the two sides share
no GIL.

The child builds its side from a picklable recipe, `make_side()`, which returns a callable
`side(chunk)` that fills one chunk, with
- `side.model`: the rollout side's policy copy, which published weights are loaded into;
- `side.state_dict()` / `side.load_state_dict(state)`: the rest of its resumable state (random
  generators, prompt streams), taken between chunks for checkpoints;
- `side.stats()`: a small dict of figures sent with every chunk (syncs seen, swaps made);
- optionally `side.refresh`, set by the loop when `inflight` is on: called mid-chunk, it loads
  weights published since the chunk began and returns the version held (RolloutLoop.refresh).

Chunks live in shared memory (`chunk.tensors()`); what a chunk holds on the host travels with
its slot index (`chunk.host_state()` / `chunk.load_host_state()`). Weights travel through one
shared copy under a lock. Checkpoints take the child's state at its next
wait for a policy version (the one point where it is between chunks and will not start another
before the trainer's publish), plus the filled chunks not yet trained on: the keys of
RolloutLoop.state_dict, so a checkpoint resumes on either transport. Failures: child.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from nostall.runtime.process.child import ChildProcess, run_child
from nostall.runtime.process.fill import ChildPlan, fill_chunks
from nostall.runtime.process.weights import SharedWeights
from nostall.runtime.protocol import LoopState
from nostall.runtime.queue import RuntimeStopped
from nostall.runtime.thread import check_slots
from nostall.runtime.timeline import Timeline


class ProcessLoop:
    inline = False  # (a child process fills)

    def __init__(
        self,
        slots: list[Any],
        make_side: Callable[[], Any],
        trainer_model: torch.nn.Module,
        *,
        staleness: int = 0,
        inflight: bool = False,
        torch_threads: int = 1,
        join_timeout_s: float = 10.0,
        liveness_timeout_s: float = 120.0,
    ):
        check_slots(staleness, len(slots))
        ctx = mp.get_context("spawn")
        self.slots = slots
        for chunk in slots:
            for tensor in chunk.tensors().values():
                tensor.share_memory_()
        self.staleness = staleness
        self.version = 0  # the trainer's: updates published
        self.stats: dict = {}  # the side's figures, as of the last chunk taken
        self.timeline = Timeline()
        self._weights = SharedWeights(ctx, trainer_model)
        self._free, self._filled = ctx.Queue(), ctx.Queue()
        self._requests, self._responses = ctx.Queue(), ctx.Queue()
        self._free_slots = list(range(len(slots)))
        self._child = ChildProcess(
            ctx, join_timeout_s=join_timeout_s, liveness_timeout_s=liveness_timeout_s
        )
        self._plan = ChildPlan(
            make_side,
            slots,
            self._weights,
            self._free,
            self._filled,
            self._child.stop,
            self._requests,
            self._responses,
            staleness,
            inflight,
            torch_threads,
        )
        self._initial_state: dict | None = None
        self._queued: list[int] = []  # restored slots, handed out first
        self._taken = 0  # chunks the child collected that the trainer has taken
        self._ahead: list[tuple] = []  # taken off the queue for a checkpoint, handed out next
        self._snapshot: dict | None = None

    def writing(self) -> contextlib.AbstractContextManager:
        """(The side reads a copy of the trainer's weights: its writes wait for nothing.)"""
        return contextlib.nullcontext()

    # -- the trainer side ----------------------------------------------------------------------
    def next_chunk(self) -> tuple[int, Any]:
        """Blocks for the next filled slot; raises (with the cause) if the rollout side died."""
        if self._queued:  # chunks restored from a checkpoint come first, in order
            slot = self._queued.pop(0)
        else:
            slot = self._take(self._ahead.pop(0) if self._ahead else self._child.get(self._filled))
        self._taken += 1
        return slot, self.slots[slot]

    def _take(self, message: tuple) -> int:
        slot, version, host_state, start, end, stats = message
        chunk = self.slots[slot]
        chunk.version = version
        chunk.load_host_state(host_state)
        self.stats = stats
        self.timeline.record("rollout", start, end)
        return slot

    def release(self, index: int) -> None:
        self._free.put(index)

    def publish(self, model: torch.nn.Module, weights: bool = True) -> int:
        """One more update done (the next version); with `weights`, `model`'s weights are
        published as that version."""
        self.version += 1
        shared = self._weights
        try:
            with shared.locked(self._child.check), torch.no_grad():
                if weights:
                    # From a GPU this copy waits for the update: another process cannot wait on
                    # this one's CUDA stream, so the weights must be complete in shared memory.
                    for name, value in model.state_dict().items():
                        shared.tensors[name].copy_(value)  # sync: cross-process weights (GPU)
                    shared.version.value = self.version
                shared.progress.value = self.version
        except RuntimeStopped:
            self._child.check()  # the child's own failure, if that is why
            raise
        return self.version

    def lag(self, chunk: Any) -> int:
        return self.version - chunk.version

    def expect(self, total: int) -> None:
        """The trainer will take `total` chunks in all: the rollout process starts none after."""
        self._weights.limit.value = total

    # -- checkpoints ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def boundary(self):
        """Takes the rollout process's state at its next wait for a policy version (before the
        block's publish lets it go on), and receives the chunks it filled before that."""
        received = self._taken + len(self._queued) + len(self._ahead)
        state, ahead = self._child.state_at_next_wait(
            self._requests, self._responses, self._filled, received
        )
        self._ahead += ahead
        self._snapshot = state
        try:
            yield
        finally:
            self._snapshot = None

    def state_dict(self, clone_slot: Callable[[Any], dict]) -> dict:
        """Inside `boundary()`: the keys of RolloutLoop.state_dict."""
        if self._snapshot is None:
            raise RuntimeError("ProcessLoop.state_dict is taken inside `with boundary():`")
        queued = []
        for slot in self._queued:
            queued.append(clone_slot(self.slots[slot]))
        for message in self._ahead:
            slot, version, host_state = message[:3]
            chunk = self.slots[slot]
            chunk.version = version
            chunk.load_host_state(host_state)
            queued.append(clone_slot(chunk))
        shared = self._weights
        with shared.locked(self._child.check):
            published = {k: v.clone() for k, v in shared.tensors.items()}
            weights_version = shared.version.value
        snapshot = self._snapshot
        return LoopState(
            version=self.version,
            rollout_version=snapshot["rollout_version"],
            chunks_collected=snapshot["chunks_collected"],
            rollout_weights=snapshot["rollout_weights"],
            published_weights=published,
            weights_version=weights_version,
            queued=queued,
        ).as_dict()

    def fill_state(self) -> dict:
        """Inside `boundary()`: the side's own state (side.state_dict())."""
        if self._snapshot is None:
            raise RuntimeError("ProcessLoop.fill_state is taken inside `with boundary():`")
        return self._snapshot["side"]

    def load_state_dict(
        self, state: dict, trainer_model: torch.nn.Module, restore_slot: Callable[[Any, dict], None]
    ) -> None:
        """Before `start`: restores a state_dict (its weights published as the saved version);
        load_fill_state gives the side's own state."""
        if self._child.process is not None:
            raise RuntimeError("load_state_dict must come before the rollout process starts")
        state = LoopState.from_dict(state)
        self.version = int(state.version)
        shared = self._weights
        with torch.no_grad():
            for name, value in state.published_weights.items():
                shared.tensors[name].copy_(value)
        shared.version.value = int(state.weights_version)
        shared.progress.value = self.version
        queued = state.queued
        if len(queued) > len(self.slots) - 1:
            raise ValueError(f"{len(queued)} queued chunks do not fit {len(self.slots)} slots")
        for slot, saved in enumerate(queued):
            restore_slot(self.slots[slot], saved)
            self._queued.append(slot)
        self._free_slots = list(range(len(queued), len(self.slots)))
        # The child's count includes the restored chunks; none of them has been taken yet.
        self._taken = int(state.chunks_collected) - len(queued)
        self._initial_state = {
            "rollout_weights": state.rollout_weights,
            "rollout_version": int(state.rollout_version),
            "chunks_collected": int(state.chunks_collected),
            "side": {},
        }

    def load_fill_state(self, side_state: dict) -> None:
        if self._initial_state is None:
            raise RuntimeError("load_fill_state comes after load_state_dict")
        self._initial_state["side"] = side_state

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> ProcessLoop:
        for i in self._free_slots:
            self._free.put(i)
        plan = dataclasses.replace(self._plan, initial_state=self._initial_state)
        body = functools.partial(fill_chunks, plan)
        self._child.start(
            run_child, (body, self._child.heartbeat(), self._child.errors, self._child.stop)
        )
        try:
            self._wait_ready()
        except BaseException:  # the child failed to start: it is joined before the error
            self.close(failed=True)
            raise
        return self

    def _wait_ready(self) -> None:
        # Returns once the child has built its side, so a run's clock starts with both sides
        # ready, as with the thread transport.
        while self._child.heartbeat_value.value == 0.0:
            self._child.check()
            time.sleep(0.005)
        state = self._initial_state
        if state is not None and self.version >= state["chunks_collected"] - self.staleness:
            # A resumed run whose rollout side may start its next chunk at once: the original
            # run's did so with the weights published at the checkpoint. Wait until the new
            # process has taken them, or the trainer could publish newer ones first.
            while self._weights.pulls.value < 1:
                self._child.check()
                time.sleep(0.005)

    def close(self, failed: bool = False) -> None:
        self._child.close(failed)

    def __enter__(self) -> ProcessLoop:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc is not None)
