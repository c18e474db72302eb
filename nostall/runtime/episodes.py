"""Episode returns and lengths, tracked on the rollout side without a host sync: each step, or
each whole chunk, is one native op (`nostall::episode_update`) that writes finished episodes
into a ring of the most recent ones, and only logging reads it. A trainer keeps one tracker a
worker (WorkerEpisodes), from the chunks it receives, whatever transport carried them."""

from __future__ import annotations

import threading

import torch

from nostall import _native  # noqa: F401  (loads the native library: episode_update)
from nostall.ops import _fake_episodes  # noqa: F401  (its fake kernel, for torch.compile)

_episode_update = torch.ops.nostall.episode_update.default


class EpisodeTracker:
    def __init__(self, num_envs: int, capacity: int = 100):
        self.capacity = capacity
        self._return = torch.zeros(num_envs, dtype=torch.float64)
        self._length = torch.zeros(num_envs, dtype=torch.int64)
        self._returns = torch.zeros(capacity, dtype=torch.float64)
        self._lengths = torch.zeros(capacity, dtype=torch.int64)
        self.finished = torch.zeros((), dtype=torch.int64)  # episodes finished so far
        self._lock = threading.Lock()

    def update(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """One step, reward float64 (N,) and done bool (N,), or T steps in time order, both
        (T, N)."""
        with self._lock:
            _episode_update(
                reward,
                done,
                self._return,
                self._length,
                self._returns,
                self._lengths,
                self.finished,
            )

    def recent(self, n: int) -> tuple[int, float | None, float | None]:
        """(episodes finished, mean return and length of the last n) -- reads: a sync."""
        with self._lock:
            finished = int(self.finished)  # sync: logging only
            count = min(n, finished, self.capacity)
            if count == 0:
                return finished, None, None
            last = (finished - 1 - torch.arange(count)) % self.capacity
            mean_return = float(self._returns[last].mean())  # sync: logging only
            mean_length = float(self._lengths[last].double().mean())  # sync: logging only
        return finished, mean_return, mean_length

    def share_memory(self) -> EpisodeTracker:
        """Moves the counters to shared memory, for a rollout side in another process."""
        for value in self.__dict__.values():
            if isinstance(value, torch.Tensor):
                value.share_memory_()
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"]  # a lock does not cross processes; each side gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def state_dict(self) -> dict:
        with self._lock:
            return {k: v.clone() for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            for k, v in state.items():
                getattr(self, k).copy_(v)


class WorkerEpisodes:
    """Every worker's episodes, each worker's rows tracked apart (an episode never mixes two
    workers' steps)."""

    def __init__(self, num_workers: int, num_envs: int):
        self.trackers = [EpisodeTracker(num_envs) for _ in range(num_workers)]

    def update(self, worker: int, rewards: torch.Tensor, done: torch.Tensor) -> None:
        self.trackers[worker].update(rewards, done)

    def add_chunk(self, chunk) -> None:
        """A received chunk's steps, into the tracker of the worker that collected it."""
        worker = getattr(chunk, "worker", 0)
        self.update(worker, chunk.rewards, chunk.terminated | chunk.truncated)

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
