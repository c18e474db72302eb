"""Runtime's trainer-facing interface over any transport's loop: the rollout side is an
EnvSide (env_side.py) filling the loop's chunks, wherever the loop runs it (ProcessLoop's
process, RayLoop's workers), and the episode statistics are kept on the trainer's side, per
worker, from the chunks it receives.

Checkpoints have Runtime.state_dict's keys: the side's state (env, generator, next_obs) and
episodes beside the loop's (versions, weights, queued chunks), so one resumes on any backend.
"""

from __future__ import annotations

import torch

from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.storage import Chunk, chunk_state, load_chunk_state

SIDE_KEYS = ("env", "generator", "next_obs")  # EnvSide.state_dict's


class WorkerEpisodes:
    """Every worker's episodes, each worker's rows tracked apart (an episode never mixes two
    workers' steps)."""

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


class LoopRuntime:
    inline = False  # (environments step on the rollout side: a thread, a process, workers)

    def __init__(self, loop, num_workers: int, num_envs: int):
        self.loop = loop
        self.slots, self.timeline = loop.slots, loop.timeline
        self.staleness, self.num_workers = loop.staleness, num_workers
        self.episodes = WorkerEpisodes(num_workers, num_envs)

    # -- the trainer side ----------------------------------------------------------------------
    def next_chunk(self) -> tuple[int, Chunk]:
        slot, chunk = self.loop.next_chunk()
        worker = getattr(chunk, "worker", 0)
        self.episodes.update(worker, chunk.rewards, chunk.terminated | chunk.truncated)
        return slot, chunk

    def release(self, slot: int) -> None:
        self.loop.release(slot)

    def publish(self, model: torch.nn.Module, weights: bool = True) -> int:
        return self.loop.publish(model, weights)

    def lag(self, chunk: Chunk) -> int:
        return self.loop.lag(chunk)

    @property
    def version(self) -> int:
        return self.loop.version

    def boundary(self):
        return self.loop.boundary()

    def expect(self, total: int) -> None:
        self.loop.expect(total)

    # -- checkpoints (inside `boundary()`) -----------------------------------------------------
    def state_dict(self) -> dict:
        state = {
            **self.loop.fill_state(),  # (worker 0's) envs, generator, next observation
            "episodes": self.episodes.trackers[0].state_dict(),
            **self.loop.state_dict(chunk_state),
        }
        if self.num_workers > 1:
            state["worker_episodes"] = self.episodes.state_dict()
        return state

    def load_state_dict(self, state: dict, agent: torch.nn.Module) -> None:
        """Before `start`: a checkpoint of any backend."""
        self.loop.load_state_dict(state, agent, load_chunk_state)
        self.loop.load_fill_state({key: state[key] for key in SIDE_KEYS})
        self.episodes.load_state_dict(state.get("worker_episodes") or [state["episodes"]])

    # -- lifetime ------------------------------------------------------------------------------
    def start(self):
        self.loop.start()
        return self

    def close(self) -> None:
        self.loop.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.loop.__exit__(exc_type, exc, tb)
