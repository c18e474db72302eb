"""Environment calls off the decoder's thread: each call runs in a thread of its own and its
result comes back through one queue, so the decoder takes whatever has finished and goes on
decoding the rest. A call past its timeout is given up (its episode fails with the cause); its
thread, which Python cannot stop, is left to end alone and its late result is dropped."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Finished:
    """One call's outcome: its key, its value or the exception it raised (TimeoutError past
    its limit), its seconds, and when it started by the wall clock (for the timeline)."""

    key: int
    value: object
    error: BaseException | None
    seconds: float
    started: float = 0.0


class EnvCalls:
    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: dict[int, tuple[float, int, float]] = {}  # key -> (start, ticket, wall)
        self._ticket = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def submit(self, key: int, call: Callable[[], object]) -> None:
        """Starts `call` for `key` (one call per key at a time)."""
        self._ticket += 1
        ticket, start, wall = self._ticket, time.perf_counter(), time.time()
        self._pending[key] = (start, ticket, wall)

        def run() -> None:
            try:
                value, error = call(), None
            except BaseException as e:  # (a user's environment: whatever it raises)
                value, error = None, e
            seconds = time.perf_counter() - start
            self._done.put((ticket, Finished(key, value, error, seconds, wall)))

        threading.Thread(target=run, name=f"nostall-env-{key}", daemon=True).start()

    def collect(self, wait: bool) -> list[Finished]:
        """The calls finished since the last collect; with `wait`, blocks until at least one
        has (or has timed out) while any is pending."""
        finished = self._drain()
        while wait and not finished and self._pending:
            deadline = self._next_deadline()
            limit = None if deadline is None else max(0.0, deadline - time.perf_counter())
            try:
                finished += self._accept([self._done.get(timeout=limit)])
            except queue.Empty:
                pass
            finished += self._drain() + self._expired()
        return finished + self._expired()

    def _drain(self) -> list[Finished]:
        items = []
        while True:
            try:
                items.append(self._done.get_nowait())
            except queue.Empty:
                return self._accept(items)

    def _accept(self, items) -> list[Finished]:
        out = []
        for ticket, result in items:
            held = self._pending.get(result.key)
            if (
                held is not None and held[1] == ticket
            ):  # (a late result of a given-up call: dropped)
                del self._pending[result.key]
                out.append(result)
        return out

    def _next_deadline(self) -> float | None:
        if self.timeout_s is None or not self._pending:
            return None
        return min(start for start, _, _ in self._pending.values()) + self.timeout_s

    def _expired(self) -> list[Finished]:
        if self.timeout_s is None:
            return []
        now = time.perf_counter()
        late = [k for k, (start, _, _) in self._pending.items() if now - start > self.timeout_s]
        out = []
        for key in late:
            start, _, wall = self._pending.pop(key)
            error = TimeoutError(f"no answer within tool_timeout {self.timeout_s} s")
            out.append(Finished(key, None, error, now - start, wall))
        return out


def bound(fn, *args, **kwargs) -> Callable[[], object]:
    return lambda: fn(*args, **kwargs)
