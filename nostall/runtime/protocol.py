"""The runtime's contracts, declared once: what a rollout side is (`Fill`), what a transport
gives the trainer (`Transport`: RolloutLoop's thread, ProcessLoop's process, RayLoop's
workers), the state every transport saves and restores (`LoopState`), and the one step every
rollout side takes, wherever it runs (`fill_chunk`).

A transport moves chunks and weights and reports failures; it knows nothing of what a chunk
holds. A fill (the environments' EnvSide, the language model's GroupGenerator) knows nothing
of where it runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

import torch

from nostall.runtime.timeline import Timeline


@runtime_checkable
class Fill(Protocol):
    """A rollout side: fills one preallocated chunk with its model's current weights."""

    model: torch.nn.Module  # the weights a transport loads each version into

    def __call__(self, chunk: Any) -> None: ...
    def stats(self) -> dict: ...  # figures a transport sends with each chunk
    def state_dict(self) -> dict: ...  # what resumes it exactly (envs, generators, prompts)
    def load_state_dict(self, state: dict) -> None: ...

    # Optional, set or called by the transport where the fill has them: `watchdog` (the one
    # its steps are marked on), `refresh` (in-flight weight swaps), and `attach(loop)` (a fill
    # built beside the trainer, on the thread transport, tied to its loop).


@runtime_checkable
class Transport(Protocol):
    """The trainer's side of a rollout loop, whatever carries the chunks."""

    slots: list[Any]
    staleness: int
    version: int  # updates published
    inline: bool  # chunks filled in next_chunk, on the trainer's own thread
    timeline: Timeline  # when each side worked (the report's overlap, timeline.png)
    # (Ray's also has `loss`: the chunks lost with a worker and each restart, for the report.)

    def next_chunk(self) -> tuple[int, Any]: ...  # blocks; raises the rollout side's error
    def release(self, index: int) -> None: ...
    def publish(self, model: torch.nn.Module, weights: bool = True) -> int: ...
    def lag(self, chunk: Any) -> int: ...
    def expect(self, total: int) -> None: ...  # the chunks the trainer takes in all
    def boundary(self) -> contextlib.AbstractContextManager: ...  # rollout side between chunks
    # Around the trainer's in-place writes of its weights: a side reading them waits.
    def writing(self) -> contextlib.AbstractContextManager: ...
    # Inside boundary(): the loop's state (LoopState's keys) and the fill's own.
    def state_dict(self, clone_slot: Callable[[Any], dict]) -> dict: ...
    def fill_state(self) -> dict: ...
    # Before start: a state of any transport.
    def load_state_dict(
        self, state: dict, trainer_model: torch.nn.Module, restore_slot: Callable[[Any, dict], None]
    ) -> None: ...
    def load_fill_state(self, state: dict) -> None: ...
    @property
    def stats(self) -> dict: ...
    def start(self) -> Transport: ...
    def close(self) -> None: ...
    def __enter__(self) -> Transport: ...
    def __exit__(self, exc_type, exc, tb) -> None: ...


@dataclass
class LoopState:
    """A transport's resumable state, taken inside its boundary (the rollout side between
    chunks), so a run resumes exactly on any transport: a checkpoint holds it as a dict of
    these keys (`as_dict`), and every transport restores it (`from_dict`)."""

    version: int  # the trainer's: updates published
    rollout_version: int  # the weights the rollout side holds (worker 0's on Ray)
    chunks_collected: int
    rollout_weights: dict[str, torch.Tensor]
    published_weights: dict[str, torch.Tensor]  # the newest published (may trail `version`)
    weights_version: int
    queued: list[dict]  # the filled chunks not yet trained on, in order
    workers: list[dict] | None = None  # Ray: each worker's side state, weights and version
    worker_seq: list[int] | None = None  # Ray: each worker's next sequence number

    def as_dict(self) -> dict:
        # (Not dataclasses.asdict: it would deep-copy every tensor.)
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in values.items() if v is not None}

    @classmethod
    def from_dict(cls, state: dict) -> LoopState:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in state.items() if k in names})


def fill_chunk(
    side: Fill, chunk: Any, pull: Callable[[], int], clock: Callable[[], float] = time.perf_counter
) -> tuple[int, float, float]:
    """The rollout side's step on every transport: pull the newest weights the staleness bound
    allows (`pull()` returns the version then held), fill the chunk, tag it with that version.
    Returns (version, start, end). A fill that takes newer weights midway (in-flight swaps)
    does not make the chunk's first part newer: the chunk keeps the version it started with."""
    version = pull()
    start = clock()
    side(chunk)
    end = clock()
    chunk.version = version
    return version, start, end
