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
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp

from nostall.runtime.process.child import POLL_S, ChildProcess, Heartbeat, run_child
from nostall.runtime.protocol import LoopState, fill_chunk
from nostall.runtime.queue import RuntimeStopped
from nostall.runtime.thread import check_slots
from nostall.runtime.timeline import Timeline


class _SharedWeights:
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


@dataclass
class _ChildPlan:
    """What the rollout process is given (pickled to it): the recipe of its side, the shared
    slots and weights, the queues (free and filled slots; checkpoint requests and responses),
    the stop flag, the staleness bound, whether weights swap in flight, its torch threads, and
    a resumed run's state (None: a fresh start)."""

    make_side: Callable
    slots: list
    weights: _SharedWeights
    free: Any
    filled: Any
    stop: Any
    requests: Any
    responses: Any
    staleness: int
    inflight: bool
    torch_threads: int
    initial_state: dict | None = None


def _fill_chunks(plan: _ChildPlan, alive: Heartbeat) -> None:
    """The child's body (run_child reports its failure)."""
    make_side, slots, weights, staleness = plan.make_side, plan.slots, plan.weights, plan.staleness
    free, filled, stop, requests, responses = (
        plan.free,
        plan.filled,
        plan.stop,
        plan.requests,
        plan.responses,
    )
    inflight, initial_state = plan.inflight, plan.initial_state
    torch.set_num_threads(plan.torch_threads)
    side = make_side()
    if hasattr(side, "watchdog"):  # the steps it marks reach the trainer (ChildProcess.check)
        side.watchdog = alive.watchdog
    model = side.model
    alive()  # the first beat: the side is built (imports and model loading take seconds)
    have, collected = -1, 0  # -1: load the published weights before the first chunk
    if initial_state is not None:  # a resumed run
        with torch.no_grad():
            for name, value in model.state_dict().items():
                value.copy_(initial_state["rollout_weights"][name])
        if initial_state["side"]:
            side.load_state_dict(initial_state["side"])
        have = int(initial_state["rollout_version"])
        collected = int(initial_state["chunks_collected"])
    held = {"version": have}
    if inflight:

        def refresh() -> int:
            held["version"] = weights.pull(model, held["version"], alive)
            return held["version"]

        side.refresh = refresh
    while not stop.is_set():
        # (Also where it stays once the trainer's last chunk is filled: it starts no more.)
        while (
            weights.progress.value < collected - staleness or 0 < weights.limit.value <= collected
        ) and not stop.is_set():
            # Waiting for the next version is the one point where this side is between chunks
            # and stays there until the trainer publishes: checkpoints are taken here.
            alive()
            with contextlib.suppress(queue.Empty):
                requests.get_nowait()
                responses.put(
                    {
                        "side": side.state_dict(),
                        "rollout_weights": {
                            k: v.detach().clone() for k, v in model.state_dict().items()
                        },
                        "rollout_version": max(held["version"], 0),
                        "chunks_collected": collected,
                    }
                )
            time.sleep(0.0005)
        if stop.is_set():
            break
        alive()
        try:
            slot = free.get(timeout=POLL_S)
        except queue.Empty:
            continue

        def pull() -> int:
            held["version"] = weights.pull(model, held["version"], alive, at_chunk_start=True)
            alive()
            return held["version"]

        chunk = slots[slot]
        version, start, end = fill_chunk(side, chunk, pull)
        collected += 1
        filled.put((slot, version, chunk.host_state(), start, end, side.stats()))


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
        self._weights = _SharedWeights(ctx, trainer_model)
        self._free, self._filled = ctx.Queue(), ctx.Queue()
        self._requests, self._responses = ctx.Queue(), ctx.Queue()
        self._free_slots = list(range(len(slots)))
        self._child = ChildProcess(
            ctx, join_timeout_s=join_timeout_s, liveness_timeout_s=liveness_timeout_s
        )
        self._plan = _ChildPlan(
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
        body = functools.partial(_fill_chunks, plan)
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
