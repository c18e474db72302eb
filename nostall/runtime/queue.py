"""A bounded queue between the rollout and trainer sides that also carries failure: if either
side dies, the other is woken within `poll_s` and gets the exception with its traceback."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class RuntimeStopped(RuntimeError):
    """The other side stopped (it failed, or shutdown was requested)."""


class SideChannel:
    """Shared stop flag and first error of a runtime."""

    def __init__(self):
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        # Called with every check: raises when the rollout side is hung (Watchdog.check).
        self.watch: Callable[[], None] | None = None

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
        self.stop.set()

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeStopped(f"the other side failed: {self.error!r}") from self.error
        if self.stop.is_set():
            raise RuntimeStopped("the runtime is shutting down")
        if self.watch is not None:
            self.watch()


class BoundedQueue:
    def __init__(self, capacity: int, channel: SideChannel, poll_s: float = 0.05):
        self._queue: queue.Queue = queue.Queue(maxsize=capacity)
        self._channel = channel
        self._poll_s = poll_s

    def put(self, item: Any) -> None:
        while True:
            self._channel.check()
            try:
                self._queue.put(item, timeout=self._poll_s)
                return
            except queue.Full:
                continue

    def peek(self) -> list[Any]:
        """The items queued now, oldest first, left in the queue."""
        with self._queue.mutex:
            return list(self._queue.queue)

    def get(self) -> Any:
        while True:
            try:
                return self._queue.get(timeout=self._poll_s)
            except queue.Empty:
                self._channel.check()
