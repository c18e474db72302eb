"""Overlapped rollout and training: chunks, queues, weight sync, and the transports that carry
chunks between a rollout side and the trainer, each in a module of its own: thread.py (a thread
beside the trainer), process/ (a process of its own), ray/ (Ray worker actors). One contract
(protocol.py: Fill, Transport, LoopState), one factory choosing a transport by name
(transports.py), one environment side (env_side.py; GRPO's is its generator)."""

from nostall.runtime.episodes import EpisodeTracker, WorkerEpisodes
from nostall.runtime.protocol import Fill, Transport
from nostall.runtime.queue import RuntimeStopped
from nostall.runtime.storage import Chunk
from nostall.runtime.transports import BACKENDS, SideRecipe, TransportOptions, open_transport
from nostall.runtime.weights import WeightBuffer

__all__ = [
    "BACKENDS",
    "Chunk",
    "EpisodeTracker",
    "Fill",
    "RuntimeStopped",
    "SideRecipe",
    "Transport",
    "TransportOptions",
    "WeightBuffer",
    "WorkerEpisodes",
    "open_transport",
]
