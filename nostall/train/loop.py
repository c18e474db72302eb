"""The training loop every trainer shares, written once (as Sample Factory's and TRL's Trainer
are): a step takes the next chunk from the transport, updates on it, releases its slot, publishes
the new weights, checkpoints at the rollout side's boundary, logs, and stops when solved.

An algorithm gives the loop its pieces through the `Hooks` protocol (PPO's in
nostall/algos/ppo/trainer.py, GRPO's in nostall/algos/grpo/trainer.py): what to update on a
chunk, what to record from it, what a checkpoint holds, what a log line says. The loop owns the
order of those pieces, which is what every algorithm must get right the same way:
- the slot is released only after everything read from the chunk was read (the rollout side
  refills it at once);
- a checkpoint is taken inside the transport's boundary, after this step's publish, where the
  rollout side is between chunks: its state and the chunks filled ahead are exact on every
  transport;
- metrics are read (a host sync) only every `log_interval` steps;
- two early steps run under SyncWatch, from taking the chunk to publishing, and report the
  trainer side's unintended syncs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

from nostall.profiler import SyncWatch, allow
from nostall.train import checkpoint
from nostall.train.result import TrainResult

# Steps whose update runs under SyncWatch, after warm-up (the optimizer's state exists from the
# first update on), to report syncs per update.
WATCHED_STEPS = (3, 4)

LogFn = Callable[[int, dict[str, float]], None]


@dataclass
class Clock:
    """perf_counter readings: `started` before the transport starts, `ready` once it runs."""

    started: float
    ready: float = 0.0


class Hooks(Protocol):
    """What an algorithm gives the loop. `config` has watch_syncs, log_interval, checkpoint,
    checkpoint_every and stop_when_solved; `transport` carries the chunks
    (nostall.runtime.Transport). Optional: `saves(step) -> bool` (a schedule of checkpoints
    of its own), `saved(step, path)` (after one is written: the rest of it, its pruning),
    `after_log(step)` (after every step's log line, before its checkpoint: TRL's evaluations)
    and `end_step(step) -> bool` (after every step, its log and checkpoint: whatever the
    algorithm does between steps; True stops the run)."""

    algorithm: str
    config: Any
    transport: Any
    model: torch.nn.Module  # the model trained: watched for syncs
    published_model: torch.nn.Module  # what the rollout side is sent (a compute copy, or model)
    result: TrainResult
    first_step: int
    last_step: int

    def running(self) -> contextlib.AbstractContextManager: ...
    def begin_step(self, step: int) -> None: ...
    def device_tensors(self, chunk: Any) -> Iterable[torch.Tensor]: ...
    def update(self, chunk: Any, step: int) -> dict[str, torch.Tensor]: ...
    def record(self, chunk: Any, lag: int, logging: bool) -> None: ...
    def publishes(self, step: int) -> bool: ...
    def at_boundary(self, step: int, clock: Clock) -> None: ...
    def snapshot(self, step: int) -> dict: ...
    def checkpoint_path(self, step: int) -> str: ...
    def log_values(
        self, step: int, values: dict[str, float], lag: int, clock: Clock
    ) -> tuple[int, dict[str, float]]: ...
    def solved(self) -> bool: ...
    def finish(self, clock: Clock, end: float) -> TrainResult: ...
    def completed(self, result: TrainResult) -> None: ...  # saves what the run leaves behind
    def interrupted(self) -> None: ...  # saves the last completed step's model


def peak_memory_mib(model: torch.nn.Module) -> dict[str, float]:
    """The run's peak memory: this process's resident set (the trainer, and the rollout side
    on the thread backend), and on a GPU the device memory torch allocated."""
    import resource

    peak = {"host": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    device = next(model.parameters()).device
    if device.type == "cuda":
        peak["device"] = round(torch.cuda.max_memory_allocated(device) / (1 << 20), 1)
    return peak


def run(hooks: Hooks, log: LogFn | None = None, time_limit_s: float | None = None) -> TrainResult:
    """Trains from `hooks.first_step` to `hooks.last_step`, calling log(progress, values) every
    log_interval steps; stops at the first log once solved (with stop_when_solved) or past
    `time_limit_s` seconds of the run."""
    config, transport, result = hooks.config, hooks.transport, hooks.result
    syncs: list[int] = []  # unintended syncs of each watched step
    if config.watch_syncs:
        SyncWatch.prepare()  # outside the run's clock
    clock = Clock(time.perf_counter())
    last = hooks.last_step
    transport.expect(last)  # the rollout side starts no chunk past the last step's
    with hooks.running():
        clock.ready = time.perf_counter()
        try:
            end = _steps(hooks, log, time_limit_s, clock, syncs)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, SIGTERM: the last step's model kept
            hooks.interrupted()
            raise
        result.syncs_per_update = sum(syncs) / len(syncs) if syncs else None
        result.timeline = transport.timeline
        loss = getattr(transport, "loss", None)  # chunks lost with a Ray worker
        if loss is not None:
            result.dropped_chunks, result.dropped_causes = loss.dropped, list(loss.causes)
            result.worker_restarts = list(loss.restarts)
        result = hooks.finish(clock, end)
        result.peak_memory_mib = peak_memory_mib(hooks.model)
        # Saved before the rollout side is closed: a close that fails (a worker's late error)
        # costs the run nothing.
        hooks.completed(result)
    return result


def _steps(
    hooks: Hooks, log: LogFn | None, time_limit_s: float | None, clock: Clock, syncs: list[int]
) -> float:
    """The steps, in the order every trainer shares; returns the clock when the last update
    ended."""
    config, transport, result = hooks.config, hooks.transport, hooks.result
    last = hooks.last_step
    for step in range(hooks.first_step, last + 1):
        hooks.begin_step(step)
        # (The run's own steps: a resumed run watches its 3rd and 4th too.)
        watched = config.watch_syncs and step - hooks.first_step + 1 in WATCHED_STEPS
        with contextlib.ExitStack() as watch_scope:
            # An inline transport generates here, on this thread: its syncs are the generator's to
            # count (it watches its own), not the update's, so its chunk is taken before the watch.
            taken = transport.next_chunk() if transport.inline else None
            watch = watch_scope.enter_context(SyncWatch(hooks.model)) if watched else None
            slot, chunk = taken or transport.next_chunk()
            if watch is not None:  # the chunk's tensors are the device tensors they are
                watch.mark(*hooks.device_tensors(chunk))  # on a GPU
            began = time.perf_counter()
            metrics = hooks.update(chunk, step)
            lag = transport.lag(chunk)
            logging = logs_at(step, config, last)
            hooks.record(chunk, lag, logging)  # before the release: the slot is refilled
            transport.release(slot)
            saving = _saves(hooks, step)
            stop = False
            with transport.boundary() if saving else contextlib.nullcontext():
                transport.publish(hooks.published_model, weights=hooks.publishes(step))
                watch_scope.close()
                hooks.at_boundary(step, clock)
                if saving:  # (the step's log line and evaluation first, as TRL's: the
                    # checkpoint holds them)
                    stop = logging and _log_step(hooks, step, metrics, lag, clock, log)
                    _after_log(hooks, step)
                    _save_checkpoint(hooks, step)
        if watch is not None:
            report = watch.report()
            syncs.append(report.unintended_count)
            result.sync_sites += [f"{s.location} {s.kind}" for s in report.unintended]
        transport.timeline.record("train", began, time.perf_counter())
        if logging and not saving:
            stop = _log_step(hooks, step, metrics, lag, clock, log)
        if not saving:
            _after_log(hooks, step)
        if logging and time_limit_s is not None:
            stop |= time.perf_counter() - clock.ready > time_limit_s
        if stop:
            break
        if getattr(hooks, "end_step", None) and hooks.end_step(step):  # (asked to stop)
            break
    # The run ends with its last update: closing the rollout side (joining a thread, a
    # process, shutting down a local Ray cluster) is not training time.
    end = time.perf_counter()
    return end


def _log_step(hooks: Hooks, step: int, metrics, lag: int, clock: Clock, log: LogFn | None) -> bool:
    """The step's metrics read and logged; whether the run stops here (solved, with
    stop_when_solved)."""
    with allow("metrics every log_interval steps"):
        values = {k: float(v) for k, v in metrics.items()}  # sync: logging
    progress, values = hooks.log_values(step, values, lag, clock)
    hooks.result.metrics = values
    if log is not None:
        log(progress, values)
    return bool(hooks.config.stop_when_solved and hooks.solved())


def _after_log(hooks: Hooks, step: int) -> None:
    """The hooks' `after_log` (GRPO's evaluations), after the step's log line and before its
    checkpoint."""
    if getattr(hooks, "after_log", None):
        hooks.after_log(step)


def logs_at(step: int, config: Any, last_step: int) -> bool:
    """Whether the loop reads and logs this step's metrics: every log_interval steps and at
    the last (an update may measure more on those steps alone)."""
    return step % config.log_interval == 0 or step == last_step


def _saves(hooks: Hooks, step: int) -> bool:
    """Whether this step ends with a checkpoint: the hooks' `saves` where they have one (GRPO's
    TRL schedule), else every checkpoint_every steps and at the last."""
    if getattr(hooks, "saves", None):
        return hooks.saves(step)
    config = hooks.config
    return bool(config.checkpoint) and (
        step % config.checkpoint_every == 0 or step == hooks.last_step
    )


def _save_checkpoint(hooks: Hooks, step: int) -> None:
    """Saves this step's checkpoint, then prunes this run's older ones past save_total_limit
    (once the new one is whole). A model holding NaN or inf is never saved: the run stops
    naming the last good checkpoint, which stays."""
    config, result = hooks.config, hooks.result
    path = hooks.checkpoint_path(step)
    bad = checkpoint.nonfinite(hooks.model.state_dict())
    if bad:
        last = result.checkpoints[-1] if result.checkpoints else None
        raise FloatingPointError(
            f"step {step}: the model holds NaN or inf ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}); checkpoint {path} not written, the last good "
            f"one is {last or '(none yet)'}"
        )
    lineage = [p for p in result.checkpoints if p != path] + [path]
    state = hooks.snapshot(step)
    state["checkpoints"] = lineage
    checkpoint.save(path, hooks.algorithm, asdict(config), state)
    result.checkpoints = lineage
    if getattr(hooks, "saved", None):  # (GRPO's checkpoint folders: the rest of each)
        hooks.saved(step, path)
        return
    limit = getattr(config, "save_total_limit", None)
    if limit:
        result.checkpoints, _ = checkpoint.prune(lineage, limit)
