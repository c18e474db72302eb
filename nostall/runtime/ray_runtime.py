"""The rollout side on Ray: K worker actors, each owning its environments and a policy copy,
filling chunks that reach the trainer through Ray's object store. The trainer-facing interface
is Runtime's (next_chunk, release, publish, lag, boundary, episodes, timeline), so a trainer
runs on threads, a process or a cluster without knowing which.

    runtime = RayRuntime(make_env, make_agent, agent, act, num_workers=2, num_steps=128,
                         staleness=1, seed=0)
    with runtime:
        slot, chunk = runtime.next_chunk()   # chunk.version, chunk.worker, chunk.seq

The guarantees of the local backends, across all workers:
- **staleness**: the k-th chunk trained on (counted over every worker) is filled by a policy of
  version at least k - S. Chunks are requested in order and handed to the trainer in that
  order (one finished early waits for those before it), so the bound holds however the
  workers' chunks interleave, and a run is the same whichever worker is quicker. S = 0 with
  one worker is the thread backend's run, bit for bit (the worker seeds its envs and generator
  as Runtime does);
- **weights once per version**: a published version is `ray.put` once and every worker reads
  that one object (a NumPy state dict, read zero-copy from the node's store), and only a worker
  behind the newest version is sent it;
- **accounting**: every chunk carries (worker, seq, version); a chunk is trained on once or
  counted as dropped with its cause (a worker that died, restarted by Ray up to max_restarts);
- **latency hidden**: `inflight` chunk requests per worker (2 by default) are outstanding, so a
  worker fills its next chunk while the trainer trains on the last one.

Environments are stepped by the workers (native rollout, or `act` step by step); each worker w
seeds its N envs with seed + w * N + i and its sampling generator with seed + w. Checkpoints
are not supported on this backend yet (a clear error at the start of a run)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.rollout import ActFn, Timeline, collect
from nostall.runtime.storage import Chunk, rollout_slots, slot_layout

# How long a worker may take to be placed and start before the run fails with the cause.
PLACE_TIMEOUT_S = 60.0


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ValueError("--backend ray needs Ray: pip install 'ray==2.58.0'") from e
    return ray


class _Worker:
    """One rollout worker (a Ray actor: see `_worker_class`): its envs, its policy copy, its
    generator, and the observation the next chunk starts from."""

    def __init__(self, make_env, make_agent, act, rollout, num_steps, seed, worker, num_envs):
        torch.set_num_threads(1)
        self.worker = worker
        self.env = make_env(seed + worker * num_envs)
        self.agent = make_agent(self.env)
        self.act, self.rollout = act, rollout
        self.generator = torch.Generator().manual_seed(seed + worker)
        self.next_obs = self.env.torch.reset(seed=seed + worker * num_envs)
        layout = slot_layout(self.env)
        self.chunk = Chunk.empty(num_steps, layout["num_envs"], layout["obs_dim"],
                                 layout["action_shape"], layout["discrete"],
                                 obs_dtype=layout["obs_dtype"])  # fmt: skip
        self.episodes = EpisodeTracker(self.env.num_envs)
        self.version = -1

    def ready(self) -> int:
        return self.worker

    def where(self) -> tuple[int, str]:
        """(process id, Ray node id): for tests and diagnostics."""
        import os

        return os.getpid(), _ray().get_runtime_context().get_node_id()

    def fill(self, seq: int, version: int, weights) -> dict:
        """Fills one chunk with the policy of `version` (`weights` is None when this worker
        already holds it) and returns its tensors as NumPy arrays (zero-copy in the store)."""
        if weights is not None:
            _copy_numpy(self.agent.state_dict(), weights)
        self.version = version
        start = time.time()
        fused = (
            None if self.rollout is None else (lambda e, c, g: self.rollout(self.agent, e, c, g))
        )
        collect(self.env, lambda obs, g: self.act(self.agent, obs, g), self.chunk,
                self.next_obs, self.generator, self.episodes, fused)  # fmt: skip
        self.next_obs = self.chunk.obs[-1].clone()
        tensors = {k: v.numpy() for k, v in self.chunk.tensors().items()}  # sync: none, host
        return {"worker": self.worker, "seq": seq, "version": version, "tensors": tensors,
                "start": start, "end": time.time()}  # fmt: skip

    def close(self) -> None:
        self.env.close()


def _copy_numpy(tensors: dict[str, torch.Tensor], arrays: dict[str, np.ndarray]) -> None:
    """Copies arrays (read-only views of the object store) into host tensors of the same
    names and shapes."""
    for name, tensor in tensors.items():
        np.copyto(tensor.numpy(), arrays[name])  # sync: none, host tensors


_WORKER_CLASS = None


def _worker_class():
    global _WORKER_CLASS
    if _WORKER_CLASS is None:
        _WORKER_CLASS = _ray().remote(_Worker)
    return _WORKER_CLASS


@dataclass
class WorkerLoss:
    """Chunks lost with their workers: counted, never trained on."""

    dropped: int = 0
    causes: list[str] = field(default_factory=list)


class _WorkerEpisodes:
    """The trainer-side view of every worker's episodes (each worker's rows tracked apart, so
    an episode never mixes two workers' steps)."""

    def __init__(self, num_workers: int, num_envs: int):
        self.trackers = [EpisodeTracker(num_envs) for _ in range(num_workers)]

    def update(self, worker: int, rewards: torch.Tensor, done: torch.Tensor) -> None:
        self.trackers[worker].update(rewards, done)

    def recent(self, n: int) -> tuple[int, float | None, float | None]:
        finished, returns, lengths, weights = 0, 0.0, 0.0, 0
        for tracker in self.trackers:
            count, mean_return, mean_length = tracker.recent(n)
            finished += count
            if mean_return is not None:
                k = min(n, count, tracker.capacity)
                returns, lengths, weights = (
                    returns + k * mean_return,
                    lengths + k * mean_length,
                    weights + k,
                )
        if weights == 0:
            return finished, None, None
        return finished, returns / weights, lengths / weights


class RayRuntime:
    def __init__(
        self,
        make_env: Callable[[int], object],
        make_agent: Callable,
        agent: torch.nn.Module,
        act: ActFn,
        *,
        num_workers: int = 1,
        num_steps: int,
        num_envs: int,
        obs_dim: int,
        action_shape: tuple[int, ...],
        discrete: bool,
        obs_dtype: torch.dtype = torch.float32,
        staleness: int = 0,
        seed: int = 0,
        rollout: Callable | None = None,
        address: str | None = None,
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0.0,
        inflight: int = 2,
        max_restarts: int = 3,
    ):
        """make_env(seed) -> one worker's vector env; make_agent(env) -> a policy of `agent`'s
        architecture. `address`: None starts a local cluster, "auto" joins a running one."""
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        if inflight < 1:
            raise ValueError(f"inflight must be at least 1, got {inflight}")
        self.ray = _ray()
        self._recipe = (make_env, make_agent, act, rollout, num_steps, seed, num_envs)
        self.num_workers, self.staleness, self.inflight = num_workers, staleness, inflight
        self._address, self._max_restarts = address, max_restarts
        self._resources = {"num_cpus": cpus_per_worker, "num_gpus": gpus_per_worker}
        self._template = agent
        # Local slots the received chunks are copied into (the trainer holds one at a time).
        self.slots = rollout_slots(0, num_steps, num_envs=num_envs, obs_dim=obs_dim,
                                   action_shape=action_shape, discrete=discrete,
                                   obs_dtype=obs_dtype)  # fmt: skip
        self._free = list(range(len(self.slots)))
        self.episodes = _WorkerEpisodes(num_workers, num_envs)
        self.timeline = Timeline()
        self.loss = WorkerLoss()
        self.version = 0  # updates the trainer has published
        self.requested = 0  # chunks requested so far, over all workers: the next request's index
        self.trained: list[tuple[int, int]] = []  # (worker, seq) of every chunk handed over
        self._weights_ref = None  # the newest published version, put once
        self._weights_version = 0
        self._worker_version: list[int] = [-1] * num_workers
        self._pending: dict = {}  # ObjectRef -> (worker, seq, request index)
        self._ready: dict[int, dict] = {}  # request index -> a result not yet handed over
        self._lost: set[int] = set()  # request indices lost with their workers
        self._next_index = 0  # the request index the trainer gets next
        self._outstanding = [0] * num_workers
        self._next_worker = 0
        self._seq = [0] * num_workers
        self._started_ray = False
        self.workers: list = []

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> RayRuntime:
        ray = self.ray
        if not ray.is_initialized():
            try:
                ray.init(address=self._address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)  # fmt: skip
            except ConnectionError as e:
                raise RuntimeError(f"cannot reach the Ray cluster at {self._address!r}: {e}") from e
            self._started_ray = True
        need = self._resources["num_cpus"] * self.num_workers
        have = ray.cluster_resources().get("CPU", 0.0)
        if need > have:
            self.close()
            raise ValueError(
                f"{self.num_workers} workers x {self._resources['num_cpus']:g} CPUs need {need:g} "
                f"CPUs; the Ray cluster has {have:g}"
            )
        make_env, make_agent, act, rollout, num_steps, seed, num_envs = self._recipe
        worker_class = _worker_class().options(
            max_restarts=self._max_restarts, max_task_retries=0, **self._resources
        )
        self.workers = [
            worker_class.remote(make_env, make_agent, act, rollout, num_steps, seed, w, num_envs)
            for w in range(self.num_workers)
        ]
        # Every worker placed and built before the run's clock: a failure now, with its cause.
        ready = [w.ready.remote() for w in self.workers]
        done, waiting = ray.wait(ready, num_returns=len(ready), timeout=PLACE_TIMEOUT_S)
        if waiting:
            self.close()
            raise RuntimeError(
                f"{len(waiting)} of {self.num_workers} Ray workers were not placed within "
                f"{PLACE_TIMEOUT_S:.0f} s (resources per worker: {self._resources})"
            )
        try:
            ray.get(done)
        except Exception as e:
            self.close()
            raise RuntimeError(f"a Ray rollout worker failed to start: {e}") from e
        self._put_weights(self._template, 0)
        self._issue()
        return self

    def close(self) -> None:
        ray = self.ray
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        self.workers, self._pending = [], {}
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> RayRuntime:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------------
    def _put_weights(self, model: torch.nn.Module, version: int) -> None:
        # sync: once per published version, the weights to the host for the object store
        state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        self._weights_ref = self.ray.put(state)
        self._weights_version = version

    def _issue(self) -> None:
        """Requests chunks while the staleness bound and each worker's `inflight` allow."""
        # Requests lost with a worker are not trained on: they do not count against the bound.
        while self.version >= self.requested - self.loss.dropped - self.staleness:
            # The least busy worker, ties to the one asked longest ago (round robin).
            order = [(self._next_worker + i) % self.num_workers for i in range(self.num_workers)]
            worker = min(order, key=lambda w: self._outstanding[w])
            if self._outstanding[worker] >= self.inflight:
                return
            fresh = self._worker_version[worker] < self._weights_version
            weights = self._weights_ref if fresh else None
            self._worker_version[worker] = self._weights_version
            seq = self._seq[worker]
            ref = self.workers[worker].fill.remote(seq, self._weights_version, weights)
            self._pending[ref] = (worker, seq, self.requested)
            self._seq[worker] += 1
            self._outstanding[worker] += 1
            self._next_worker = (worker + 1) % self.num_workers
            self.requested += 1

    # -- the trainer side ----------------------------------------------------------------------
    def next_chunk(self) -> tuple[int, Chunk]:
        """The next chunk in request order; a worker that died loses its chunks in flight
        (counted, with the cause), and is asked again once Ray has restarted it."""
        ray = self.ray
        while True:
            self._issue()
            while self._next_index in self._lost:
                self._next_index += 1
            if self._next_index in self._ready:
                result = self._ready.pop(self._next_index)
                self._next_index += 1
                return self._receive(result)
            if not self._pending:
                raise RuntimeError("no chunk requested: the staleness bound allows none")
            (ref,), _ = ray.wait(list(self._pending), num_returns=1)
            worker, seq, index = self._pending.pop(ref)
            self._outstanding[worker] -= 1
            try:
                self._ready[index] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._drop(worker, seq, index, e)
            except ray.exceptions.RayTaskError as e:  # the worker's own code raised
                raise RuntimeError(f"Ray rollout worker {worker} failed:\n{e}") from e

    def _drop(self, worker: int, seq: int, index: int, error: Exception) -> None:
        self._lost.add(index)
        self.loss.dropped += 1
        self.loss.causes.append(f"worker {worker} chunk {seq}: {type(error).__name__}")
        self._worker_version[worker] = -1  # a restarted worker holds its initial weights
        if self.loss.dropped > (self._max_restarts + 1) * self.num_workers * self.inflight:
            raise RuntimeError(f"Ray workers keep dying: {self.loss.causes[-3:]}") from error

    def _receive(self, result: dict) -> tuple[int, Chunk]:
        slot = self._free.pop()
        chunk = self.slots[slot]
        _copy_numpy(chunk.tensors(), result["tensors"])
        chunk.version, chunk.worker, chunk.seq = result["version"], result["worker"], result["seq"]
        self.episodes.update(chunk.worker, chunk.rewards, chunk.terminated | chunk.truncated)
        self.trained.append((chunk.worker, chunk.seq))
        origin = time.time() - time.perf_counter() + self.timeline.origin
        self.timeline.spans.append(("rollout", result["start"] - origin, result["end"] - origin))
        return slot, chunk

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def publish(self, model: torch.nn.Module, weights: bool = True) -> int:
        self.version += 1
        if weights:
            self._put_weights(model, self.version)
        self._issue()
        return self.version

    def lag(self, chunk: Chunk) -> int:
        return self.version - chunk.version

    @contextlib.contextmanager
    def boundary(self):
        yield

    def state_dict(self) -> dict:
        raise ValueError("checkpoints are not supported with --backend ray yet; run without "
                         "--checkpoint, or use --backend thread|process")  # fmt: skip

    def load_state_dict(self, state: dict, agent: torch.nn.Module) -> None:
        self.state_dict()
