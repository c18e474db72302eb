"""Overlapped rollout and training: chunks, queues, weight sync, and the rollout side in a
thread (Runtime), in its own process (ProcessRuntime) or on Ray workers
(ray_runtime.RayRuntime): one loop interface (loop.py, process_loop.py, ray_loop.py) declared
in protocol.py (Transport, Fill, LoopState), one environment side (env_side.py), one
trainer-facing runtime (env_runtime.LoopRuntime)."""

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
