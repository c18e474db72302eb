"""The rollout process's body: what it is given (ChildPlan, pickled to it) and what it does
with it (fill_chunks): build its side from the recipe, then fill free slots within the
staleness bound, pulling each version's weights, answering checkpoint requests at its wait for
a version, and stopping when told or when the trainer's last chunk is filled."""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from nostall.runtime.process.child import POLL_S, Heartbeat
from nostall.runtime.process.weights import SharedWeights
from nostall.runtime.protocol import fill_chunk


@dataclass
class ChildPlan:
    """What the rollout process is given (pickled to it): the recipe of its side, the shared
    slots and weights, the queues (free and filled slots; checkpoint requests and responses),
    the stop flag, the staleness bound, whether weights swap in flight, its torch threads, and
    a resumed run's state (None: a fresh start)."""

    make_side: Callable
    slots: list
    weights: SharedWeights
    free: Any
    filled: Any
    stop: Any
    requests: Any
    responses: Any
    staleness: int
    inflight: bool
    torch_threads: int
    initial_state: dict | None = None


def fill_chunks(plan: ChildPlan, alive: Heartbeat) -> None:
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
