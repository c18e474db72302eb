"""The rollout side on Ray: K worker actors, each owning its environments and a policy copy,
filling chunks that reach the trainer through Ray's object store. The trainer-facing interface
is Runtime's (next_chunk, release, publish, lag, boundary, state_dict, episodes, timeline), so
a trainer runs on threads, a process or a cluster without knowing which.

    runtime = RayRuntime(make_env, make_agent, agent, act, num_workers=2, num_steps=128,
                         staleness=1, seed=0, **slot_layout(env))
    with runtime:
        slot, chunk = runtime.next_chunk()   # chunk.version, chunk.worker, chunk.seq

The guarantees of the local backends, across all workers:
- **staleness**: the k-th chunk trained on (counted over every worker) is filled by a policy of
  version at least k - S. Chunk k is requested from worker k mod K, as soon as the bound
  allows (so S + 1 requests are in flight: S >= 2K - 1 keeps two per worker), and chunks reach
  the trainer in request order (one finished early waits for those before it). A run is
  therefore the same whichever worker is quicker, and S = 0 with one worker is the thread
  backend's run, bit for bit (the worker seeds its envs and generator as Runtime does);
- **weights once per version**: a published version is `ray.put` once and every worker reads
  that one object (a NumPy state dict, read zero-copy from the node's store), and only a worker
  behind the newest version is sent it;
- **accounting**: every chunk carries (worker, seq, version); a chunk is trained on once or
  counted as dropped with its cause (a worker that died, restarted by Ray up to max_restarts);
- **checkpoints**: inside `boundary()` no request is made, the chunks in flight are received,
  and each worker's state (envs, generator, next observation, weights) is read: the keys of
  Runtime.state_dict (worker 0's at the top level, every worker's under "workers"), so a
  one-worker checkpoint resumes on any backend and any checkpoint resumes exactly here.

Each worker w seeds its N envs with seed + w * N + i and its sampling generator with seed + w."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.reaper import Reaper, descendants
from nostall.runtime.rollout import ActFn, Timeline, collect
from nostall.runtime.runner import chunk_state
from nostall.runtime.storage import Chunk, rollout_slots, slot_layout

# How long a worker may take to be placed and start before the run fails with the cause.
PLACE_TIMEOUT_S = 60.0
# The per-worker keys of a checkpoint (Runtime.state_dict's names).
WORKER_KEYS = ("env", "generator", "next_obs", "rollout_weights", "rollout_version")


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ValueError("--backend ray needs Ray: pip install 'ray==2.58.0'") from e
    return ray


def _copy_numpy(tensors: dict[str, torch.Tensor], arrays: dict[str, np.ndarray]) -> None:
    """Copies arrays (read-only views of the object store) into host tensors of the same
    names and shapes."""
    for name, tensor in tensors.items():
        np.copyto(tensor.numpy(), arrays[name])  # sync: none, host tensors


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
        self.episodes = EpisodeTracker(self.env.num_envs)  # collect's; the trainer keeps its own
        self.version = -1  # made by make_agent, not yet any published version

    def ready(self) -> int:
        return self.worker

    def where(self) -> tuple[int, str]:
        """(process id, Ray node id): for tests and diagnostics."""
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

    def state(self) -> dict:
        """Between fills (actor calls run in order): what resumes this worker exactly."""
        return {
            "env": self.env.state_dict(),
            "generator": self.generator.get_state(),
            "next_obs": self.next_obs.clone(),
            "rollout_weights": {k: v.clone() for k, v in self.agent.state_dict().items()},
            "rollout_version": self.version,
        }

    def load(self, state: dict) -> None:
        self.env.load_state_dict(state["env"])
        self.generator.set_state(state["generator"])
        self.next_obs = state["next_obs"].clone()
        self.agent.load_state_dict(state["rollout_weights"])
        self.version = int(state["rollout_version"])


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
        """(episodes finished, mean return and length of each worker's last n, pooled)."""
        finished, returns, lengths, weights = 0, 0.0, 0.0, 0
        for tracker in self.trackers:
            count, mean_return, mean_length = tracker.recent(n)
            finished += count
            if mean_return is not None:
                k = min(n, count, tracker.capacity)
                returns, lengths = returns + k * mean_return, lengths + k * mean_length
                weights += k
        if weights == 0:
            return finished, None, None
        return finished, returns / weights, lengths / weights

    def state_dict(self) -> list[dict]:
        return [tracker.state_dict() for tracker in self.trackers]

    def load_state_dict(self, states: list[dict]) -> None:
        for tracker, state in zip(self.trackers, states, strict=True):
            tracker.load_state_dict(state)


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
        max_restarts: int = 3,
    ):
        """make_env(seed) -> one worker's vector env; make_agent(env) -> a policy of `agent`'s
        architecture. `address`: None starts a local cluster, "auto" joins a running one."""
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.ray = _ray()
        self._recipe = (make_env, make_agent, act, rollout, num_steps, seed, num_envs)
        self.num_workers, self.staleness = num_workers, staleness
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
        self._seq = [0] * num_workers
        self._held = False  # inside boundary(): no request is made
        self._resume: dict | None = None  # a checkpoint's state, applied at start
        self._started_ray = False
        self._reaper: Reaper | None = None
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
                f"{self.num_workers} workers x {self._resources['num_cpus']:g} CPUs need "
                f"{need:g} CPUs; the Ray cluster has {have:g}"
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
        self._wait_all([w.ready.remote() for w in self.workers], "start")
        if self._started_ray:
            # The local cluster's processes (the raylet's agents outlive a killed driver):
            # killed by a watchdog whenever this process exits.
            self._reaper = Reaper(descendants(os.getpid()))
        if self._resume is not None:
            self._apply_resume(self._resume)
            self._resume = None
        else:
            self._put_weights(self._template, 0)
        self._issue()
        return self

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
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None

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
        """Requests chunks while the staleness bound allows, chunk k from worker k mod K."""
        # Requests lost with a worker are not trained on: they do not count against the bound.
        while not self._held and self.version >= self.requested - len(self._lost) - self.staleness:
            worker = self.requested % self.num_workers
            fresh = self._worker_version[worker] < self._weights_version
            weights = self._weights_ref if fresh else None
            self._worker_version[worker] = self._weights_version
            seq = self._seq[worker]
            ref = self.workers[worker].fill.remote(seq, self._weights_version, weights)
            self._pending[ref] = (worker, seq, self.requested)
            self._seq[worker] += 1
            self.requested += 1

    def _receive_one(self) -> None:
        """Waits for any request in flight: its result is kept (for its turn) or its loss
        counted."""
        ray = self.ray
        (ref,), _ = ray.wait(list(self._pending), num_returns=1)
        worker, seq, index = self._pending.pop(ref)
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
        if self.loss.dropped > (self._max_restarts + 1) * (self.staleness + 1):
            raise RuntimeError(f"Ray workers keep dying: {self.loss.causes[-3:]}") from error

    # -- the trainer side ----------------------------------------------------------------------
    def next_chunk(self) -> tuple[int, Chunk]:
        """The next chunk in request order; a worker that died loses its chunks in flight
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
                raise RuntimeError("no chunk requested: the staleness bound allows none")
            self._receive_one()

    def _hand_over(self, result: dict) -> tuple[int, Chunk]:
        slot = self._free.pop()
        chunk = self.slots[slot]
        _copy_numpy(chunk.tensors(), result["tensors"])
        chunk.version, chunk.worker, chunk.seq = result["version"], result["worker"], result["seq"]
        self.episodes.update(chunk.worker, chunk.rewards, chunk.terminated | chunk.truncated)
        self.trained.append((chunk.worker, chunk.seq))
        if "start" in result:  # a chunk filled in this run (not one restored from a checkpoint)
            offset = time.time() - time.perf_counter() + self.timeline.origin
            self.timeline.spans.append(("rollout", result["start"] - offset,
                                        result["end"] - offset))  # fmt: skip
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
        """No request is made inside: the workers finish what they were asked and stop."""
        self._held = True
        try:
            yield
        finally:
            self._held = False
            self._issue()

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Inside `boundary()`: Runtime.state_dict's keys (worker 0's state at the top level),
        every worker's state under "workers", the chunks filled and not yet trained on in
        order under "queued"."""
        if not self._held:
            raise RuntimeError("RayRuntime.state_dict is taken inside `with boundary():`")
        while self._pending:  # the chunks in flight: received now, trained on after resume
            self._receive_one()
        workers = self._wait_all([w.state.remote() for w in self.workers], "save its state")
        queued = []
        for index in sorted(self._ready):
            if index >= self._next_index:
                result = self._ready[index]
                chunk = self.slots[self._free[-1]]  # a free slot as scratch: copied out below
                _copy_numpy(chunk.tensors(), result["tensors"])
                chunk.version = result["version"]
                queued.append({**chunk_state(chunk), "worker": result["worker"],
                               "seq": result["seq"]})  # fmt: skip
        published = ray_get_weights(self.ray, self._weights_ref)
        return {
            **{key: workers[0][key] for key in WORKER_KEYS},
            "workers": workers,
            "worker_seq": list(self._seq),
            "episodes": self.episodes.trackers[0].state_dict(),
            "worker_episodes": self.episodes.state_dict(),
            "version": self.version,
            "chunks_collected": self.requested - len(self._lost),
            "published_weights": published,
            "weights_version": self._weights_version,
            "queued": queued,
        }

    def load_state_dict(self, state: dict, agent: torch.nn.Module) -> None:
        """Before `start`: a checkpoint of any backend (one worker's keys at the top level; a
        Ray checkpoint's every worker under "workers")."""
        if self.workers:
            raise RuntimeError("load_state_dict must come before the runtime starts")
        workers = state.get("workers") or [{key: state[key] for key in WORKER_KEYS}]
        if len(workers) != self.num_workers:
            raise ValueError(f"the checkpoint has {len(workers)} rollout workers, this run "
                             f"{self.num_workers}")  # fmt: skip
        self._resume = {**state, "workers": workers}
        self.version = int(state["version"])
        self.episodes.load_state_dict(state.get("worker_episodes") or [state["episodes"]])

    def _apply_resume(self, state: dict) -> None:
        pairs = zip(self.workers, state["workers"], strict=True)
        self._wait_all([worker.load.remote(saved) for worker, saved in pairs], "load its state")
        published = {k: v.numpy() for k, v in state["published_weights"].items()}
        self._weights_ref = self.ray.put(published)
        self._weights_version = int(state["weights_version"])
        self._worker_version = [int(w["rollout_version"]) for w in state["workers"]]
        self._seq = list(state.get("worker_seq") or [int(state["chunks_collected"])])
        self.requested = int(state["chunks_collected"])
        queued = state["queued"]
        self._next_index = self.requested - len(queued)
        for i, saved in enumerate(queued):
            tensors = {k: saved[k].numpy() for k in self.slots[0].tensors()}
            self._ready[self._next_index + i] = {
                "worker": int(saved.get("worker", 0)), "seq": int(saved.get("seq", -1)),
                "version": int(saved["version"]), "tensors": tensors,
            }  # fmt: skip


def ray_get_weights(ray, ref) -> dict[str, torch.Tensor]:
    """The published weights as tensors (copies: a checkpoint outlives the object store)."""
    return {k: torch.from_numpy(np.array(v)) for k, v in ray.get(ref).items()}
