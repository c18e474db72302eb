"""The rollout side in its own process: the same trainer-facing interface as Runtime, but no
GIL shared between the two sides, so collecting and learning really overlap on two cores.

Chunks, weights and episode counters live in shared memory; slot indices, failures and timing
travel through multiprocessing queues. The rollout process builds its own environments and
policy copy from picklable recipes. A failure there reaches the trainer within a poll interval
with the child's traceback; leaving the context stops and joins the process. Checkpoints ask
the rollout process for its state (environments, generator, next observation) while it waits
for the next policy version, and a resumed run hands that state to the new process.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import time
import traceback
from collections.abc import Callable

import torch
import torch.multiprocessing as mp

from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.queue import RuntimeStopped
from nostall.runtime.rollout import ActFn, Timeline, collect
from nostall.runtime.storage import Chunk, rollout_slots

_POLL_S = 0.05


def _rollout_main(
    make_env: Callable,
    make_agent: Callable,
    act: ActFn,
    slots: list[Chunk],
    weights: dict[str, torch.Tensor],
    version,
    weights_version,
    lock,
    free,
    filled,
    errors,
    stop,
    episodes: EpisodeTracker,
    staleness: int,
    seed: int,
    requests,
    responses,
    rollout: Callable | None,
    initial_state: dict | None,
) -> None:
    try:
        torch.set_num_threads(1)
        env = make_env()
        agent = make_agent(env)
        generator = torch.Generator().manual_seed(seed)
        next_obs = env.torch.reset(seed=seed)
        if initial_state is not None:  # a resumed run
            env.load_state_dict(initial_state["env"])
            generator.set_state(initial_state["generator"])
            next_obs = initial_state["next_obs"].clone()
        have, collected = -1, 0
        while not stop.is_set():
            while version.value < collected - staleness and not stop.is_set():
                # Waiting for the next version is the one point where this side's state is
                # between chunks: checkpoints are taken here.
                with contextlib.suppress(queue.Empty):
                    requests.get_nowait()
                    responses.put(
                        {
                            "env": env.state_dict(),
                            "generator": generator.get_state(),
                            "next_obs": next_obs.clone(),
                        }
                    )
                time.sleep(0.0005)
            if stop.is_set():
                break
            with lock:
                if weights_version.value > have:
                    agent.load_state_dict(weights)
                    have = weights_version.value
            try:
                slot = free.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            chunk = slots[slot]
            start = time.perf_counter()
            fused = None if rollout is None else functools.partial(rollout, agent)
            collect(
                env, lambda obs, g: act(agent, obs, g), chunk, next_obs, generator, episodes, fused
            )
            next_obs = chunk.obs[-1].clone()
            collected += 1
            filled.put((slot, have, start, time.perf_counter()))
        env.close()
    except BaseException as e:
        errors.put(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        stop.set()


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
        staleness: int = 0,
        seed: int = 0,
        join_timeout_s: float = 10.0,
        rollout: Callable | None = None,
    ):
        # Shared memory cannot also be pinned: a trainer on a GPU copies these chunks with a
        # host wait (each a few kB); the thread backend pins its chunks instead.
        self.slots = rollout_slots(
            staleness, num_steps, num_envs=num_envs, obs_dim=obs_dim,
            action_shape=action_shape, discrete=discrete,
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
        self._lock = ctx.Lock()
        self._free, self._filled, self._errors = ctx.Queue(), ctx.Queue(), ctx.Queue()
        self._requests, self._responses = ctx.Queue(), ctx.Queue()
        for i in range(len(self.slots)):
            self._free.put(i)
        self._stop = ctx.Event()
        self.episodes = EpisodeTracker(num_envs).share_memory()
        self.timeline = Timeline()
        self._ctx = ctx
        self._process_args = (
            make_env, make_agent, act, self.slots, self._weights, self._version,
            self._weights_version, self._lock,
            self._free, self._filled, self._errors, self._stop, self.episodes, staleness, seed,
            self._requests, self._responses, rollout,
        )  # fmt: skip
        self._initial_state: dict | None = None
        self._process = None
        self._join_timeout_s = join_timeout_s

    def _raise_if_failed(self) -> None:
        if self._process is None:
            raise RuntimeStopped("the rollout process was not started (use `with runtime:`)")
        try:
            message = self._errors.get_nowait()
        except queue.Empty:
            if not self._process.is_alive():
                raise RuntimeStopped("the rollout process exited unexpectedly") from None
            return
        raise RuntimeStopped(f"the rollout process failed: {message}")

    def next_chunk(self) -> tuple[int, Chunk]:
        while True:
            try:
                slot, version, start, end = self._filled.get(timeout=_POLL_S)
            except queue.Empty:
                self._raise_if_failed()
                continue
            self.timeline.record("rollout", start, end)
            self.slots[slot].version = version
            return slot, self.slots[slot]

    def release(self, slot: int) -> None:
        self._free.put(slot)

    def publish(self, agent: torch.nn.Module, weights: bool = True) -> int:
        """As Runtime.publish: one more update, and its weights with `weights`."""
        self.version += 1
        with self._lock, torch.no_grad():
            if weights:
                # From a GPU this copy waits for the update: another process cannot wait on
                # this process's CUDA stream, so the weights must be complete in shared memory.
                for name, value in agent.state_dict().items():
                    self._weights[name].copy_(value)  # sync: cross-process weights (on a GPU)
                self._weights_version.value = self.version
            self._version.value = self.version
        return self.version

    def lag(self, chunk: Chunk) -> int:
        return self.version - chunk.version

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The rollout side's resumable state, fetched from its process at the next point where
        it waits for a policy version. Exact with staleness 0, between a release and the next
        publish (as for the thread backend)."""
        self._requests.put("state")
        while True:
            try:
                state = self._responses.get(timeout=_POLL_S)
            except queue.Empty:
                self._raise_if_failed()
                continue
            with self._lock:
                weights = {k: v.clone() for k, v in self._weights.items()}
            return {**state, "episodes": self.episodes.state_dict(), "rollout_weights": weights}

    def load_state_dict(self, state: dict, agent: torch.nn.Module) -> None:
        """Restores a state_dict before the rollout process starts; its policy copy starts from
        the weights last published (or `agent`'s, from a state without them)."""
        if self._process is not None:
            raise RuntimeError("load_state_dict must come before the rollout process starts")
        with torch.no_grad():
            for name, value in state.get("rollout_weights", agent.state_dict()).items():
                self._weights[name].copy_(value)
        self.episodes.load_state_dict(state["episodes"])
        self._initial_state = {k: state[k] for k in ("env", "generator", "next_obs")}

    def __enter__(self) -> ProcessRuntime:
        self._process = self._ctx.Process(
            target=_rollout_main,
            args=(*self._process_args, self._initial_state),
            name="nostall-rollout",
            daemon=True,
        )
        self._process.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._process is None:
            return
        self._process.join(timeout=self._join_timeout_s)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()
