"""The rollout side's loop, written once for any kind of chunk: wait until the staleness bound
allows the next chunk, pull the newest published weights into the rollout side's model, fill a
free preallocated slot, hand it to the trainer with the policy version that filled it.

    loop = RolloutLoop(slots, fill, rollout_model, trainer_model, staleness=1)
    with loop:
        for _ in range(steps):
            index, chunk = loop.next_chunk()   # chunk.version: the policy that filled it
            ...update on chunk...
            loop.release(index)
            with loop.boundary():              # the rollout side is between chunks here
                loop.publish(trainer_model)    # the next version
                state = loop.state_dict()      # for a checkpoint, exact at any staleness

`fill(chunk)` fills one slot (the rollout side's work: environment steps, or generation and
rewards). Staleness bound S: chunk k is filled by a policy of version at least k - S; S = 0
alternates strictly with the trainer (synchronous training). A failure on either side reaches
the other within a poll interval with its traceback; leaving the context joins the thread.

`inline=True` (staleness 0 only) fills each chunk in `next_chunk`, on the trainer's own thread:
the sides alternate anyway, and torch's CPU kernels then keep one OpenMP team. A second thread
running them makes libgomp manage more threads than there are cores, and it then stops
spinning between parallel regions: each region starts with a futex wake (on two cores, a
135M-shape batch of generation took 294 ms from a second thread against 221 ms from the first).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from nostall.runtime.protocol import LoopState, fill_chunk
from nostall.runtime.queue import BoundedQueue, RuntimeStopped, SideChannel
from nostall.runtime.shared_weights import SharedWeights
from nostall.runtime.timeline import Timeline
from nostall.runtime.watchdog import HangError, Watchdog
from nostall.runtime.weights import WeightBuffer


def check_slots(staleness: int, num_slots: int) -> None:
    """Staleness S needs S + 2 slots: S + 1 filled ahead of the trainer, one being trained on."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    if num_slots < staleness + 2:
        raise ValueError(f"staleness {staleness} needs {staleness + 2} slots, got {num_slots}")


class RolloutLoop:
    def __init__(
        self,
        slots: list[Any],
        fill: Callable[[Any], None],
        rollout_model: torch.nn.Module,
        trainer_model: torch.nn.Module,
        *,
        staleness: int = 0,
        join_timeout_s: float = 10.0,
        watchdog: Watchdog | None = None,
        inline: bool = False,
    ):
        """`watchdog`: the one `fill` marks its steps on (nostall.runtime.watchdog); the
        trainer checks it while it waits for a chunk, so a hung fill is named, not waited on
        (an inline fill is not waited on: it watches its own steps where it can, as
        GroupGenerator's reward calls do). `inline`: see the module's docstring."""
        check_slots(staleness, len(slots))
        if inline and staleness != 0:
            raise ValueError(
                f"inline fills need staleness 0 (the sides alternate), got {staleness}"
            )
        self.inline = inline
        self.slots = slots
        self.staleness = staleness
        self._fill = fill
        self.rollout_model = rollout_model
        self.channel = SideChannel()
        self.watchdog = watchdog
        if watchdog is not None:
            self.channel.watch = watchdog.check
        # One model for both sides: no copies. At staleness >= 1 the sides then take turns on
        # the weights: the trainer writes them inside `writing()` (see shared_weights.py).
        if rollout_model is trainer_model:
            self.weights: WeightBuffer | SharedWeights = SharedWeights(trainer_model, self.channel)
        else:
            self.weights = WeightBuffer(trainer_model)
        self.version = 0  # the trainer's: updates published
        self.rollout_version = 0  # the weights the rollout side holds
        self.chunks_collected = 0
        self.timeline = Timeline()
        self._free = BoundedQueue(len(slots), self.channel)
        self._filled = BoundedQueue(len(slots), self.channel)
        for i in range(len(slots)):
            self._free.put(i)
        # Held by the rollout side while it is inside a chunk (pull + fill + hand-over), so the
        # trainer can find it between chunks: checkpoints are taken there.
        self._busy = threading.Lock()
        self._thread: threading.Thread | None = None
        self._join_timeout_s = join_timeout_s
        self.limit: int | None = None  # chunks the trainer will take in all (expect)
        self._hung = False

    # -- the rollout side ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.channel.stop.is_set():
                if self.limit is not None and self.chunks_collected >= self.limit:
                    return  # the trainer's last chunk is filled: nothing more to start
                self.weights.wait_for(self.chunks_collected - self.staleness, self.channel.stop)
                self.channel.check()
                self._fill_next()
        except RuntimeStopped:
            pass
        except BaseException as e:  # reaches the trainer with its traceback
            self.channel.fail(e)

    def _fill_next(self) -> None:
        """Fills the next free slot and hands it over (the weights allowed already held)."""
        index = self._free.get()
        with self._busy:
            try:
                _, start, end = fill_chunk(self._fill, self.slots[index], self.refresh)
            finally:
                self.release_weights()  # (the fill may have let them go already)
            self.timeline.record("rollout", start, end)
            self.chunks_collected += 1
            self._filled.put(index)

    def refresh(self) -> int:
        """From inside `fill` (the rollout side, mid-chunk): loads weights published since the
        chunk began, if any, and returns the version now held. For fills that can take new
        weights between their steps (a generator between decode steps); the chunk keeps the
        version it started with, so the staleness bound still holds for its every part."""
        self.rollout_version = self.weights.pull(self.rollout_model, self.rollout_version)
        return self.rollout_version

    def release_weights(self) -> None:
        """From inside `fill`: done reading the weights for this chunk (a batch generated; its
        rewards may follow). Shared weights are held from the pull until then."""
        self.weights.release()

    # -- the trainer side ----------------------------------------------------------------------
    def writing(self) -> contextlib.AbstractContextManager:
        """Around the trainer's in-place writes of its weights (an optimizer step): with the
        rollout side sharing them, waits until it is not reading them."""
        return self.weights.writing()

    def next_chunk(self) -> tuple[int, Any]:
        """Blocks for the next filled slot; raises (with the cause) if the rollout side died,
        or HangError if it is hung (its watchdog). Inline: fills it here, unless a chunk
        restored from a checkpoint is waiting; a failing fill raises as on the thread."""
        if self.inline and not self._filled.peek():
            if self.version < self.chunks_collected:  # (strict alternation: never waits)
                raise RuntimeError(
                    f"next_chunk at staleness 0 before update {self.chunks_collected} was published"
                )
            try:
                self._fill_next()
            except HangError:
                self._hung = True
                raise
            except Exception as e:  # RuntimeStopped with the cause chained, as on the thread
                self.channel.fail(e)
                self.channel.check()
        try:
            index = self._filled.get()
        except HangError:
            self._hung = True
            raise
        return index, self.slots[index]

    def release(self, index: int) -> None:
        self._free.put(index)

    def publish(self, model: torch.nn.Module, weights: bool = True) -> int:
        """One more update done (the next version); with `weights`, `model`'s weights are
        published as that version."""
        self.version += 1
        if weights:
            self.weights.publish(model, self.version)
        else:
            self.weights.advance(self.version)
        return self.version

    def lag(self, chunk: Any) -> int:
        return self.version - chunk.version

    @contextlib.contextmanager
    def boundary(self) -> Iterator[None]:
        """Waits until the rollout side is between chunks and keeps it there for the block."""
        while not self._busy.acquire(timeout=0.05):
            self.channel.check()
        try:
            yield
        finally:
            self._busy.release()

    # -- checkpoints: call inside boundary() ---------------------------------------------------
    def state_dict(self, clone_slot: Callable[[Any], dict]) -> dict:
        """The loop's resumable state (LoopState's keys): versions, counts, the rollout side's
        weights, and the filled chunks not yet trained on (`clone_slot(chunk)` copies one), in
        order. The weights are the live tensors, not copies: valid for the boundary block
        (the rollout side waits, and only the trainer publishes)."""
        return LoopState(
            version=self.version,
            rollout_version=self.rollout_version,
            chunks_collected=self.chunks_collected,
            rollout_weights={k: v.detach() for k, v in self.rollout_model.state_dict().items()},
            published_weights=self.weights.newest(copy=False),
            weights_version=self.weights.version,
            queued=[clone_slot(self.slots[i]) for i in self._filled.peek()],
        ).as_dict()

    def load_state_dict(
        self, state: dict, trainer_model: torch.nn.Module, restore_slot: Callable[[Any, dict], None]
    ) -> None:
        """Before `start`: restores a state_dict: the weights last published (which may be older
        than the trainer's, when it publishes every K updates) and the trainer's progress."""
        if self._thread is not None:
            raise RuntimeError("load_state_dict must come before the loop starts")
        state = LoopState.from_dict(state)
        self.version = int(state.version)
        self.rollout_version = int(state.rollout_version)
        self.chunks_collected = int(state.chunks_collected)
        self.weights.publish_state(state.published_weights, int(state.weights_version))
        self.weights.advance(self.version)
        if self.rollout_model is not trainer_model:  # (shared: the trainer's, restored by it)
            with torch.no_grad():
                for name, value in self.rollout_model.state_dict().items():
                    value.copy_(state.rollout_weights[name])
        queued = state.queued
        if len(queued) > len(self.slots) - 1:
            raise ValueError(f"{len(queued)} queued chunks do not fit {len(self.slots)} slots")
        for saved in queued:
            index = self._free.get()
            restore_slot(self.slots[index], saved)
            self._filled.put(index)

    # -- the fill's own state and figures (fill.state_dict(), fill.stats(), when it has them) --
    def fill_state(self) -> dict:
        """Inside `boundary()`: the fill's resumable state."""
        return self._fill.state_dict()

    def load_fill_state(self, state: dict) -> None:
        self._fill.load_state_dict(state)

    @property
    def stats(self) -> dict:
        return self._fill.stats() if hasattr(self._fill, "stats") else {}

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> RolloutLoop:
        if self.inline:
            return self  # (the fills run in next_chunk)
        self._thread = threading.Thread(target=self._run, name="nostall-rollout", daemon=True)
        self._thread.start()
        return self

    def expect(self, total: int) -> None:
        """The trainer will take `total` chunks in all (counting those of the run resumed): the
        rollout side starts none after the last, so the run ends with its last update instead
        of waiting for a chunk nobody takes."""
        self.limit = total

    def close(self) -> None:
        """Stops the rollout side. A fill still running after the join timeout (a long batch of
        generation, a slow reward) is left to end on its own: the thread is a daemon, it starts
        nothing more, and the trainer's results are not lost to it."""
        self.channel.stop.set()
        if self._thread is not None:
            # A fill the watchdog found hung will not end: no wait for it.
            hung = isinstance(self.channel.error, HangError) or self._hung
            self._thread.join(timeout=0.0 if hung else self._join_timeout_s)
            if self._thread.is_alive():
                warnings.warn(
                    f"the rollout thread is still inside a chunk after "
                    f"{self._join_timeout_s:g} s; it ends when that chunk does",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return  # (the fill still runs: what it holds stays)
            self._thread = None
        if hasattr(self._fill, "close"):
            self._fill.close()

    def __enter__(self) -> RolloutLoop:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        error = self.channel.error
        self.close()
        if exc is None and error is not None:
            raise RuntimeStopped(f"the rollout side failed: {error!r}") from error
