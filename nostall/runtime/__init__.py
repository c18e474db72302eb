"""Overlapped rollout and training: chunks, queues, weight sync, and the rollout side in a
thread (Runtime) or in its own process (ProcessRuntime)."""

from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.process import ProcessRuntime
from nostall.runtime.queue import RuntimeStopped
from nostall.runtime.runner import Runtime
from nostall.runtime.storage import Chunk
from nostall.runtime.weights import WeightBuffer

__all__ = [
    "Chunk",
    "EpisodeTracker",
    "ProcessRuntime",
    "Runtime",
    "RuntimeStopped",
    "WeightBuffer",
]
