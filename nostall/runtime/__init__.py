"""Overlapped rollout and training: chunks, queues, weight sync, the rollout thread."""

from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.queue import RuntimeStopped
from nostall.runtime.runner import Runtime
from nostall.runtime.storage import Chunk
from nostall.runtime.weights import WeightBuffer

__all__ = ["Chunk", "EpisodeTracker", "Runtime", "RuntimeStopped", "WeightBuffer"]
