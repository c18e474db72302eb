"""RolloutLoop's interface with the rollout side on Ray: K worker actors, each building its
side from a picklable recipe (`make_side(worker)`, as ProcessLoop's child does) and filling
slots (environment rollouts, or GRPO's generation) that reach the trainer through Ray's store.

A side is a callable `side(slot)` that fills one slot, with `side.model` (the policy copy that
published weights are loaded into), `side.state_dict()` / `side.load_state_dict()` (its
resumable state: environments, generators, prompt streams) and optionally `side.stats()`.
A slot has `tensors()`, `version`, and `host_state()` / `load_host_state()` (its host part).

The guarantees of the local transports, across all workers:
- **staleness**: the k-th slot trained on (counted over every worker) was filled by a policy of
  version at least k - S. Slot k is requested from worker k mod K as soon as the bound allows
  (S + 1 requests are in flight: S >= 2K - 1 keeps two per worker), and slots reach the
  trainer in request order (one finished early waits for those before it). A run is therefore
  the same whichever worker is quicker, and S = 0 with one worker is the thread transport's
  run, bit for bit;
- **weights once per version**: a published version is `ray.put` once (a NumPy state dict,
  read zero-copy from each node's store) and only a worker behind it is sent the reference;
- **accounting**: every slot carries (worker, seq, version); a request is trained on once or
  counted as dropped with its cause (a worker that died, restarted by Ray up to max_restarts);
- **checkpoints**: inside `boundary()` no request is made, the requests in flight are
  received, and each worker's side state and weights are read: RolloutLoop.state_dict's keys
  (worker 0's at the top level, every worker's under "workers"), so a one-worker checkpoint
  resumes on any transport and any checkpoint resumes exactly here;
- **clean exits**: too few CPUs is an error at once; a run that started its own local cluster
  leaves no Ray process behind however it ends, and kills none it did not start (reaper.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from nostall.runtime.gpus import check_fits, physical_gpu
from nostall.runtime.ray.checkpoints import RayCheckpoints
from nostall.runtime.ray.cluster import init_ray
from nostall.runtime.ray.losses import WorkerLoss, await_restart
from nostall.runtime.ray.reaper import Reaper, children, descendants
from nostall.runtime.ray.worker import Worker, copy_numpy, ray_module, to_arrays
from nostall.runtime.thread import check_slots
from nostall.runtime.timeline import Timeline
from nostall.runtime.watchdog import HangError

# How long workers may take to be placed, start, or save and load their state.
PLACE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RayOptions:
    """Where and how a RayLoop's workers run."""

    num_workers: int = 1
    address: str | None = None  # None: a local cluster started for the run; "auto": the running
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    max_restarts: int = 3  # Ray's restarts of a worker that died
    torch_threads: int = 1  # each worker's
    # "store": each version `ray.put` once; "collective": broadcast by gloo or NCCL
    # (collective_weights.py; a worker lost then ends the run, as it cannot rejoin).
    weights: str = "store"
    # The longest the trainer waits for a chunk from any worker (one hung whole; a step a
    # worker's own watchdog finds hung comes back as its error).
    chunk_timeout_s: float = 3600.0
    # The driver has NCCL peers of its own on the cluster (trainer ranks), so a local cluster
    # leaves its GPU out, as it does for a collective broadcast (gpus.py).
    private_gpu: bool = False


class RayLoop(RayCheckpoints):
    inline = False  # (Ray workers fill)

    def __init__(
        self,
        slots: list[Any],
        make_side: Callable[[int], Any],
        trainer_model: torch.nn.Module,
        *,
        staleness: int = 0,
        options: RayOptions = RayOptions(),
    ):
        """`slots`: the trainer's (at least 2; received slots are copied into them);
        `make_side(worker)`: a worker's side, built in the worker; `options`: where and how the
        workers run (RayOptions)."""
        num_workers, weights = options.num_workers, options.weights
        if weights not in ("store", "collective"):
            raise ValueError(f"weights must be store or collective, got {weights!r}")
        check_slots(staleness, max(len(slots), staleness + 2))
        if len(slots) < 2:
            raise ValueError(f"RayLoop needs 2 slots, got {len(slots)}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.ray = ray_module()
        self.slots, self.staleness, self.num_workers = slots, staleness, num_workers
        self._make_side, self._trainer_model = make_side, trainer_model
        self._address, self._threads = options.address, options.torch_threads
        self._chunk_timeout_s = options.chunk_timeout_s
        self._collective = weights == "collective"
        self._max_restarts = 0 if self._collective else options.max_restarts
        self._private_gpu = options.private_gpu or self._collective
        self._hidden_gpu: str | None = None  # the driver's, left out of a local cluster
        self._sender = None  # with weights="collective": collective_weights.Sender
        self._published: dict[str, torch.Tensor] | None = None  # its newest, for checkpoints
        self._resources = {"num_cpus": options.cpus_per_worker, "num_gpus": options.gpus_per_worker}
        self._free, self.timeline = list(range(len(slots))), Timeline()
        self.loss = WorkerLoss()
        self.version = 0  # updates the trainer has published
        self.requested = 0  # requests made so far, over all workers: the next one's index
        self.trained: deque[tuple[int, int]] = deque(maxlen=10_000)  # the last (worker, seq)
        self._stats: dict = {}
        self._weights_ref = None  # the newest published version, put once
        self._weights_version, self._dtypes = 0, {}
        self._worker_version: list[int] = [-1] * num_workers
        self._pending: dict = {}  # ObjectRef -> (worker, seq, request index)
        self._ready: dict[int, dict] = {}  # request index -> a result not yet handed over
        self._lost: set[int] = set()  # request indices lost with their workers
        self._next_index = 0  # the request index the trainer gets next
        self._seq = [0] * num_workers
        self._held = False  # inside boundary(): no request is made
        self._resume: dict | None = None  # a checkpoint's state, applied at start
        self.limit: int | None = None  # chunks the trainer will take in all (expect)
        self._started_ray, self._spared = False, set()  # (the user's processes: never reaped)
        self._reaper: Reaper | None = None
        self.workers: list = []

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> RayLoop:
        ray = self.ray
        if not ray.is_initialized():
            if self._private_gpu and self._address is None:
                self._hidden_gpu = physical_gpu(next(self._trainer_model.parameters()).device)
            self._spared = children(os.getpid())
            init_ray(ray, self._address, self._hidden_gpu)
            self._started_ray = True
        hidden = self._hidden_gpu  # (NCCL needs a GPU a process)
        besides = "" if hidden is None else f" besides the driver's GPU {hidden}"
        try:
            check_fits(
                ray.cluster_resources(),
                self._resources,
                self.num_workers,
                f"{self.num_workers} workers",
                besides,
            )
        except ValueError:
            self.close()
            raise
        worker_class = ray.remote(Worker).options(
            max_restarts=self._max_restarts, max_task_retries=0, **self._resources
        )
        self.workers = [
            worker_class.remote(
                self._make_side, w, self.slots[0], self._threads, self._max_restarts > 0
            )
            for w in range(self.num_workers)
        ]
        # Every worker placed and built before the run's clock: a failure now, with its cause.
        self._wait_all([w.ready.remote() for w in self.workers], "start")
        if self._started_ray:
            # The local cluster's processes (its agents outlive a killed driver; all exist once
            # the workers do), not the user's: killed by a watchdog whenever this one exits.
            self._reaper = Reaper(descendants(os.getpid(), self._spared))
        if self._collective:
            self._join_collective()
        if self._resume is not None:
            self._apply_resume(self._resume)
            self._resume = None
        else:
            self._put_weights(self._trainer_model, 0)
        self._issue()
        return self

    def _join_collective(self) -> None:
        from nostall.runtime.distributed import open_store
        from nostall.runtime.ray.collective_weights import Sender

        host, world = self.ray.util.get_node_ip_address(), self.num_workers + 1
        store = open_store(host, world)  # (listening before any worker connects)
        device = str(next(self._trainer_model.parameters()).device)
        joined = [w.join_weights.remote(host, store.port, world, device) for w in self.workers]
        try:
            self._sender = Sender(store, world, torch.device(device))
        except Exception as e:
            self.close()
            raise RuntimeError(f"the workers could not join the weight broadcast: {e}") from e
        self._wait_all(joined, "join the weight broadcast")

    def _wait_all(self, refs: list, what: str) -> list:
        ray = self.ray
        _, waiting = ray.wait(refs, num_returns=len(refs), timeout=PLACE_TIMEOUT_S)
        if waiting:
            self.close()
            raise RuntimeError(
                f"{len(waiting)} of {self.num_workers} Ray workers did not {what} within "
                f"{PLACE_TIMEOUT_S:.0f} s (resources per worker: {self._resources})"
            )
        try:
            return ray.get(refs)
        except Exception as e:
            self.close()
            raise RuntimeError(f"a Ray rollout worker failed to {what}: {e}") from e

    def close(self) -> None:
        ray = self.ray
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        self.workers, self._pending = [], {}
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None

    def __enter__(self) -> RayLoop:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------------
    def _put_weights(self, model: torch.nn.Module, version: int) -> None:
        self._weights_version = version
        if self._sender is not None:  # broadcast from the trainer's device, in order
            self._sender.publish(model.state_dict(), version)
            self._published = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return
        # The weights to the host for the object store, once a version.
        state, self._dtypes = to_arrays(model.state_dict())  # sync: once
        self._weights_ref = self.ray.put(state)

    def _issue(self) -> None:
        """Requests slots while the staleness bound allows, slot k from worker k mod K."""
        # Requests lost with a worker are not trained on: they do not count against the bound
        # (nor against the chunks the trainer will take in all, `expect`).
        while not self._held and self.version >= self.requested - len(self._lost) - self.staleness:
            if self.limit is not None and self.requested - len(self._lost) >= self.limit:
                return
            worker = self.requested % self.num_workers
            fresh = self._worker_version[worker] < self._weights_version
            weights = self._weights_ref if fresh and self._sender is None else None
            self._worker_version[worker] = self._weights_version
            seq = self._seq[worker]
            ref = self.workers[worker].fill.remote(seq, self._weights_version, weights)
            self._pending[ref] = (worker, seq, self.requested)
            self._seq[worker] += 1
            self.requested += 1

    def _receive_one(self) -> None:
        """Waits for any request in flight: its result is kept for its turn, or its loss
        counted."""
        ray = self.ray
        waited, began = [], time.monotonic()
        while not waited:  # in short waits: no wait without an end
            waited, _ = ray.wait(list(self._pending), num_returns=1, timeout=1.0)
            if not waited and time.monotonic() - began > self._chunk_timeout_s:
                workers = sorted({worker for worker, _, _ in self._pending.values()})
                raise HangError(
                    f"no chunk arrived from Ray workers {workers} in "
                    f"{self._chunk_timeout_s:g} s: hung, or too slow"
                )
        (ref,) = waited
        worker, seq, index = self._pending.pop(ref)
        try:
            self._ready[index] = self.loss.delivered(ray.get(ref))
        except ray.exceptions.RayActorError as e:
            self._drop(worker, seq, index, e)
        except ray.exceptions.RayTaskError as e:  # the side's own code raised
            cause = getattr(e, "cause", None)
            if isinstance(cause, HangError):  # its watchdog named a hung step
                raise HangError(f"Ray rollout worker {worker}: {cause}") from None
            raise RuntimeError(f"Ray rollout worker {worker} failed:\n{e}") from e

    def _drop(self, worker: int, seq: int, index: int, error: Exception) -> None:
        """`worker` died: its other requests finished before (received) or were lost with it;
        once Ray restarts it, its streams are restored to after its last delivered chunk."""
        lost = [(seq, index, error)]
        for ref, (w, s, i) in sorted(self._pending.items(), key=lambda item: item[1][1]):
            if w == worker:  # (actor calls run in order: each is done or failed by now)
                del self._pending[ref]
                try:
                    self._ready[i] = self.loss.delivered(self.ray.get(ref))
                except self.ray.exceptions.RayActorError as e:
                    lost.append((s, i, e))
        for s, i, e in lost:
            self._lost.add(i)
            self.loss.lost(worker, s, e)
        self._worker_version[worker] = -1  # a restarted worker holds its initial weights
        if self.loss.dropped > (self._max_restarts + 1) * (self.staleness + 1):
            raise RuntimeError(f"Ray workers keep dying: {self.loss.causes[-3:]}") from error
        await_restart(self.ray, self.workers[worker], f"worker {worker}", PLACE_TIMEOUT_S)
        self.loss.restore(self.ray, self.workers[worker], worker, PLACE_TIMEOUT_S)

    def writing(self) -> contextlib.AbstractContextManager:
        """(The side reads a copy of the trainer's weights: its writes wait for nothing.)"""
        return contextlib.nullcontext()

    # -- the trainer side ----------------------------------------------------------------------
    def next_chunk(self) -> tuple[int, Any]:
        """The next slot in request order; a worker that died loses its requests in flight
        (counted, with the cause), and is asked again once Ray has restarted it."""
        while True:
            self._issue()
            while self._next_index in self._lost:
                self._next_index += 1
            if self._next_index in self._ready:
                result = self._ready.pop(self._next_index)
                self._next_index += 1
                return self._hand_over(result)
            if not self._pending:
                raise RuntimeError("no slot requested: the staleness bound allows none")
            self._receive_one()

    def _hand_over(self, result: dict) -> tuple[int, Any]:
        index = self._free.pop()
        slot = self.slots[index]
        self._load(slot, result)
        self.trained.append((slot.worker, slot.seq))
        self._stats = result.get("stats") or self._stats
        if "start" in result:  # filled in this run (not restored from a checkpoint)
            self.timeline.record_wall("rollout", result["start"], result["end"])
        return index, slot

    @staticmethod
    def _load(slot: Any, result: dict) -> None:
        copy_numpy(slot.tensors(), result["tensors"])
        slot.load_host_state(result["host"])
        slot.version, slot.worker, slot.seq = result["version"], result["worker"], result["seq"]

    def expect(self, total: int) -> None:
        """The trainer will take `total` chunks in all: no request is made after the last."""
        self.limit = total

    def release(self, index: int) -> None:
        self._free.append(index)

    def publish(self, model: torch.nn.Module, weights: bool = True) -> int:
        self.version += 1
        if weights:
            self._put_weights(model, self.version)
        self._issue()
        return self.version

    def lag(self, slot: Any) -> int:
        return self.version - slot.version

    @property
    def stats(self) -> dict:
        """The newest figures a worker's side sent with its slot."""
        return dict(self._stats)

    @contextlib.contextmanager
    def boundary(self):
        """No request is made inside: the workers finish what they were asked and stop."""
        self._held = True
        try:
            yield
        finally:
            self._held = False
            self._issue()
