"""The rollout side in its own process: the same trainer-facing interface as Runtime, but no
GIL shared between the two sides, so collecting and learning really overlap on two cores.

Chunks, weights and episode counters live in shared memory; slot indices, failures, heartbeats
and timing travel through multiprocessing queues and values. The rollout process builds its
own environments and policy copy from picklable recipes.

Failures, both ways, are reported within about a second (nostall/runtime/child.py).

Checkpoints (`with runtime.boundary(): publish; state_dict()`) take the child's state while it
waits for the next policy version, plus the filled chunks not yet trained on: the same keys as
the thread backend's, so a checkpoint resumes on either.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import time
from collections.abc import Callable

import torch
import torch.multiprocessing as mp

from nostall.runtime.child import POLL_S, ChildProcess, Heartbeat, run_child
from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.queue import RuntimeStopped
from nostall.runtime.rollout import ActFn, Timeline, collect
from nostall.runtime.runner import chunk_state, load_chunk_state
from nostall.runtime.storage import Chunk, rollout_slots

_LOCK_TIMEOUT_S = 5.0


def _collect_chunks(make_env: Callable, make_agent: Callable, act: ActFn, slots: list[Chunk],
                    weights: dict[str, torch.Tensor], version, weights_version, pulls, lock, free,
                    filled, stop, episodes: EpisodeTracker, staleness: int, seed: int, requests,
                    responses, rollout: Callable | None, initial_state: dict | None,
                    alive: Heartbeat) -> None:  # fmt: skip
    """The child's body (run_child reports its failure): builds the environments and the
    policy copy from their recipes and collects chunks."""
    torch.set_num_threads(1)
    env = make_env()
    agent = make_agent(env)
    generator = torch.Generator().manual_seed(seed)
    next_obs = env.torch.reset(seed=seed)
    have, collected = -1, 0
    if initial_state is not None:  # a resumed run
        env.load_state_dict(initial_state["env"])
        generator.set_state(initial_state["generator"])
        next_obs = initial_state["next_obs"].clone()
        agent.load_state_dict(initial_state["rollout_weights"])
        have = int(initial_state["rollout_version"])
        collected = int(initial_state["chunks_collected"])
    while not stop.is_set():
        while version.value < collected - staleness and not stop.is_set():
            # Waiting for the next version is the one point where this side's state is
            # between chunks: checkpoints are taken here.
            alive()
            with contextlib.suppress(queue.Empty):
                requests.get_nowait()
                responses.put(
                    {
                        "env": env.state_dict(),
                        "generator": generator.get_state(),
                        "next_obs": next_obs.clone(),
                        "rollout_weights": {
                            k: v.detach().clone() for k, v in agent.state_dict().items()
                        },
                        "rollout_version": max(have, 0),
                        "chunks_collected": collected,
                    }
                )
            time.sleep(0.0005)
        if stop.is_set():
            break
        waited = 0.0
        while not lock.acquire(timeout=POLL_S):  # the trainer may have died holding it
            alive()
            waited += POLL_S
            if waited > _LOCK_TIMEOUT_S:
                raise RuntimeError("the weight lock was held too long by the trainer")
        try:
            if weights_version.value > have:
                agent.load_state_dict(weights)
                have = weights_version.value
            pulls.value += 1
        finally:
            lock.release()
        try:
            slot = free.get(timeout=POLL_S)
        except queue.Empty:
            continue
        chunk = slots[slot]
        start = time.perf_counter()
        fused = None if rollout is None else functools.partial(rollout, agent)
        collect(env, lambda obs, g: act(agent, obs, g), chunk, next_obs, generator, episodes, fused)
        next_obs = chunk.obs[-1].clone()
        collected += 1
        filled.put((slot, have, start, time.perf_counter()))
    env.close()


class ProcessRuntime:
    def __init__(
        self,
        make_env: Callable,
        make_agent: Callable,
        agent: torch.nn.Module,
        act: ActFn,
        *,
        num_envs: int,
        obs_dim: int,
        action_shape: tuple[int, ...],
        discrete: bool,
        num_steps: int,
        obs_dtype: torch.dtype = torch.float32,
        staleness: int = 0,
        seed: int = 0,
        join_timeout_s: float = 5.0,
        liveness_timeout_s: float = 60.0,
        rollout: Callable | None = None,
    ):
        # Shared memory cannot also be pinned: a trainer on a GPU copies these chunks with a
        # host wait (each a few kB); the thread backend pins its chunks instead.
        self.slots = rollout_slots(
            staleness, num_steps, num_envs=num_envs, obs_dim=obs_dim,
            action_shape=action_shape, discrete=discrete, obs_dtype=obs_dtype,
        )  # fmt: skip
        ctx = mp.get_context("spawn")
        self.staleness, self.version = staleness, 0
        for chunk in self.slots:
            for tensor in chunk.tensors().values():
                tensor.share_memory_()
        self._weights = {
            k: v.detach().to("cpu", copy=True).share_memory_()
            for k, v in agent.state_dict().items()
        }
        self._version = ctx.Value("q", 0)  # updates done
        self._weights_version = ctx.Value("q", 0)  # the version of the weights in self._weights
        self._pulls = ctx.Value("q", 0)  # weight checks the child has made (one per chunk)
        self._lock = ctx.Lock()
        self._free, self._filled = ctx.Queue(), ctx.Queue()
        self._requests, self._responses = ctx.Queue(), ctx.Queue()
        self._free_slots = list(range(len(self.slots)))
        self._child = ChildProcess(ctx, join_timeout_s=join_timeout_s,
                                   liveness_timeout_s=liveness_timeout_s)  # fmt: skip
        self.episodes = EpisodeTracker(num_envs).share_memory()
        self.timeline = Timeline()
        self._body_args = (
            make_env, make_agent, act, self.slots, self._weights, self._version,
            self._weights_version, self._pulls, self._lock, self._free, self._filled,
            self._child.stop, self.episodes, staleness, seed, self._requests, self._responses,
            rollout,
        )  # fmt: skip
        self._initial_state: dict | None = None
        self._queued: list[tuple[int, int]] = []  # restored (slot, version), handed out first
        self._taken = 0  # chunks the child collected that the trainer has taken
        self._ahead: list[tuple] = []  # taken off the queue for a checkpoint, handed out next
        self._snapshot: dict | None = None

    @property
    def _process(self):
        return self._child.process

    # -- the trainer side ----------------------------------------------------------------------
    def next_chunk(self) -> tuple[int, Chunk]:
        if self._queued:  # chunks restored from a checkpoint come first, in order
            slot, version = self._queued.pop(0)
        elif self._ahead:
            slot, version, start, end = self._ahead.pop(0)
            self.timeline.record("rollout", start, end)
        else:
            slot, version, start, end = self._get_filled()
            self.timeline.record("rollout", start, end)
        self._taken += 1
        self.slots[slot].version = version
        return slot, self.slots[slot]

    def _get_filled(self) -> tuple:
        return self._child.get(self._filled)

    def release(self, slot: int) -> None:
        self._free.put(slot)

    def publish(self, agent: torch.nn.Module, weights: bool = True) -> int:
        """As Runtime.publish: one more update, and its weights with `weights`."""
        self.version += 1
        if not self._lock.acquire(timeout=_LOCK_TIMEOUT_S):
            self._child.check()
            raise RuntimeStopped("the weight lock was held for too long by the rollout process")
        try:
            with torch.no_grad():
                if weights:
                    # From a GPU this copy waits for the update: another process cannot wait
                    # on this process's CUDA stream, so the weights must be complete in shared
                    # memory.
                    for name, value in agent.state_dict().items():
                        self._weights[name].copy_(value)  # sync: cross-process weights (GPU)
                    self._weights_version.value = self.version
                self._version.value = self.version
        finally:
            self._lock.release()
        return self.version

    def lag(self, chunk: Chunk) -> int:
        return self.version - chunk.version

    # -- checkpoints ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def boundary(self):
        """Takes the rollout process's state at its next wait for a policy version (before the
        block's publish lets it go on), and the filled chunks not yet trained on."""
        received = self._taken + len(self._queued) + len(self._ahead)
        state, ahead = self._child.state_at_next_wait(self._requests, self._responses,
                                                      self._filled, received)  # fmt: skip
        self._ahead += ahead
        in_order = self._queued + [(slot, version) for slot, version, _, _ in self._ahead]
        state["queued"] = [
            {**chunk_state(self.slots[slot]), "version": version} for slot, version in in_order
        ]
        self._snapshot = state
        try:
            yield
        finally:
            self._snapshot = None

    def state_dict(self) -> dict:
        """Inside `boundary()`: the same keys as Runtime.state_dict."""
        if self._snapshot is None:
            raise RuntimeError("ProcessRuntime.state_dict is taken inside `with boundary():`")
        if not self._lock.acquire(timeout=_LOCK_TIMEOUT_S):
            raise RuntimeStopped("the weight lock was held for too long by the rollout process")
        try:
            published = {k: v.clone() for k, v in self._weights.items()}
            weights_version = self._weights_version.value
        finally:
            self._lock.release()
        return {**self._snapshot, "episodes": self.episodes.state_dict(), "version": self.version,
                "published_weights": published, "weights_version": weights_version}  # fmt: skip

    def load_state_dict(self, state: dict, agent: torch.nn.Module) -> None:
        """Restores a state_dict before the rollout process starts; `agent` is published as the
        saved version."""
        if self._process is not None:
            raise RuntimeError("load_state_dict must come before the rollout process starts")
        self.version = int(state["version"])
        with torch.no_grad():
            for name, value in state["published_weights"].items():
                self._weights[name].copy_(value)
        self._weights_version.value = int(state["weights_version"])
        self._version.value = self.version
        self.episodes.load_state_dict(state["episodes"])
        queued = state["queued"]
        if len(queued) > len(self.slots) - 1:
            raise ValueError(f"{len(queued)} queued chunks do not fit {len(self.slots)} slots")
        for slot, saved in enumerate(queued):
            load_chunk_state(self.slots[slot], saved)
            self._queued.append((slot, int(saved["version"])))
        self._free_slots = list(range(len(queued), len(self.slots)))
        # The child's count includes the restored chunks; none of them has been taken yet.
        self._taken = int(state["chunks_collected"]) - len(queued)
        self._initial_state = {
            k: state[k]
            for k in ("env", "generator", "next_obs", "rollout_weights", "rollout_version",
                      "chunks_collected")
        }  # fmt: skip

    # -- lifetime ------------------------------------------------------------------------------
    def __enter__(self) -> ProcessRuntime:
        for i in self._free_slots:
            self._free.put(i)
        body = functools.partial(_collect_chunks, *self._body_args, self._initial_state)
        self._child.start(run_child, (body, self._child.heartbeat(), self._child.errors,
                                      self._child.stop))  # fmt: skip
        state = self._initial_state
        if state is not None and self.version >= int(state["chunks_collected"]) - self.staleness:
            # A resumed run whose rollout side may start its next chunk at once: the original
            # run's did so right after the checkpoint's publish, with those weights. Wait until
            # the new process has taken them (it takes about a second to start), or the trainer
            # would publish newer ones first and the resumed run would collect with those.
            while self._pulls.value < 1:
                self._child.check()
                time.sleep(0.005)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._child.close(failed=exc is not None)
