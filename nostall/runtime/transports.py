"""The one place a transport is chosen by name, for every algorithm. An algorithm gives its
chunks (`slots`), a recipe for its rollout side and the trainer's model; what it gets back is a
Transport (protocol.py), and that is all it sees:

    loop = open_transport("process", slots, SideRecipe(beside, anew), model,
                          TransportOptions(staleness=1))

- "thread" (thread.py): the side is built beside the trainer (`recipe.beside()`: it may share
  the trainer's objects) and fills from a thread, or inline on the trainer's own;
- "process" (process/): built anew in a process of its own (`recipe.anew(0)`);
- "ray" (ray/): built anew on each of K Ray workers (`recipe.anew(w)`).

`anew` is pickled to where it runs: a module-level function or a functools.partial of one,
with settings (a config, paths), never live objects.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from nostall.runtime.process.loop import ProcessLoop
from nostall.runtime.protocol import Fill, Transport
from nostall.runtime.ray.loop import RayLoop, RayOptions
from nostall.runtime.thread import RolloutLoop
from nostall.runtime.watchdog import Watchdog

BACKENDS = ("thread", "process", "ray")


@dataclass(frozen=True)
class SideRecipe:
    """How to build a rollout side: `beside()` in the trainer's process (the thread transport),
    `anew(worker)` where it runs (a process, a Ray worker; picklable)."""

    beside: Callable[[], Fill]
    anew: Callable[[int], Fill] | None = None  # None: only the thread transport can run it


@dataclass(frozen=True)
class TransportOptions:
    """How a transport runs its side; each reads what applies to it."""

    staleness: int = 0
    # thread, at staleness 0: each chunk filled in next_chunk, on the trainer's own thread
    inline: bool = False
    inflight: bool = False  # thread, process: the side swaps in new weights within a chunk
    torch_threads: int = 1  # process (Ray's: ray.torch_threads)
    join_timeout_s: float = 10.0  # thread, process: how long a close waits for the side
    liveness_timeout_s: float = 120.0  # process: a silent child is named after this long
    ray: RayOptions = field(default_factory=RayOptions)


def check_backend(backend: str, argument: str = "backend") -> None:
    """ValueError naming `argument` unless `backend` names a transport."""
    if backend not in BACKENDS:
        raise ValueError(f"{argument} must be thread, process or ray, got {backend!r}")


def open_transport(
    backend: str,
    slots: list[Any],
    recipe: SideRecipe,
    trainer_model: torch.nn.Module,
    options: TransportOptions,
) -> Transport:
    """The transport named `backend` (not yet started) carrying `slots` between the side
    `recipe` builds and the trainer, whose `trainer_model` it publishes."""
    check_backend(backend)
    if backend != "thread" and recipe.anew is None:
        raise ValueError(
            f"backend {backend!r} builds the rollout side where it runs, from a picklable "
            "recipe: this side can only be built beside the trainer (backend 'thread')"
        )
    if backend == "ray":
        return RayLoop(
            slots, recipe.anew, trainer_model, staleness=options.staleness, options=options.ray
        )
    if backend == "process":
        return ProcessLoop(
            slots,
            functools.partial(recipe.anew, 0),
            trainer_model,
            staleness=options.staleness,
            inflight=options.inflight,
            torch_threads=options.torch_threads,
            join_timeout_s=options.join_timeout_s,
            liveness_timeout_s=options.liveness_timeout_s,
        )
    return _thread(slots, recipe.beside(), trainer_model, options)


def _thread(slots: list[Any], side: Fill, trainer_model, options: TransportOptions) -> RolloutLoop:
    # A side that marks its steps gets a watchdog, as a process's or a worker's does: the
    # trainer checks it while it waits for a chunk, so a hung step is named, not waited on.
    watchdog = None
    if hasattr(side, "watchdog"):
        watchdog = side.watchdog = Watchdog()
    loop = RolloutLoop(
        slots,
        side,
        side.model,
        trainer_model,
        staleness=options.staleness,
        join_timeout_s=options.join_timeout_s,
        watchdog=watchdog,
        inline=options.inline,
    )
    if hasattr(side, "attach"):  # what ties a side built beside the trainer to its loop
        side.attach(loop)
    if options.inflight:
        side.refresh = loop.refresh
    return loop
