"""What the rollout side is doing and since when, so a hang is named, not waited on forever.

The rollout side marks each step of its work with a limit, `watchdog.doing("reward function
accuracy", 600)` before a reward call, `doing("generation, decode step 17", 600)` before a
decode step (every step beats), and `idle()` between chunks. The trainer, while it waits for a
chunk, calls `check()`: a step past its limit raises `HangError` naming it. For a rollout
process the three fields live in shared memory; a Ray worker runs its fill in a thread and
checks from the actor's own (`run_watched`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

POLL_S = 0.05
_WHAT_BYTES = 240


class HangError(TimeoutError):
    """A step of the rollout side ran past its limit (a hung reward function or generation)."""


class _Value:
    """The thread backend's stand-in for a multiprocessing Value (the GIL orders its writes)."""

    def __init__(self, value):
        self.value = value


class Watchdog:
    def __init__(self, ctx=None):
        """`ctx`: a multiprocessing context, for a watchdog a child process writes and its
        parent reads; None: both sides are threads of one process."""
        if ctx is None:
            self._what, self._since, self._limit = _Value(b""), _Value(0.0), _Value(0.0)
        else:
            self._what = ctx.Array("c", _WHAT_BYTES, lock=False)
            self._since = ctx.Value("d", 0.0, lock=False)
            self._limit = ctx.Value("d", 0.0, lock=False)

    def doing(self, what: str, limit_s: float | None, limit_name: str = "") -> None:
        """The rollout side begins `what`, which may take up to `limit_s` seconds (None: no
        limit; `limit_name`: the setting that sets it, for the message); also a beat: a step
        marked again restarts its clock."""
        self._limit.value = 0.0  # (no reader sees the new name with the old clock)
        self._what.value = f"{what}\x1f{limit_name}".encode()[: _WHAT_BYTES - 1]
        self._since.value = time.monotonic()
        self._limit.value = float(limit_s or 0.0)

    def idle(self) -> None:
        """Between steps: nothing to time (and a beat)."""
        self._limit.value = 0.0
        self._since.value = time.monotonic()

    @property
    def last_beat(self) -> float:
        """When the rollout side last marked a step or went idle (monotonic s; 0: never)."""
        return self._since.value

    @property
    def busy(self) -> bool:
        return self._limit.value > 0.0

    def check(self) -> None:
        """HangError if the current step has run past its limit."""
        limit = self._limit.value
        if limit <= 0.0:
            return
        elapsed = time.monotonic() - self._since.value
        if elapsed > limit:
            what, _, name = self._what.value.decode(errors="replace").partition("\x1f")
            setting = f"{name} = {limit:g} s" if name else f"{limit:g} s"
            raise HangError(
                f"{what} has not returned after {elapsed:.1f} s (limit: "
                f"{setting}): hung, or too slow for the limit"
            )


def run_watched(fn: Callable[[], Any], watchdog: Watchdog | None) -> Any:
    """fn() in a thread of its own while this one checks `watchdog`: its result, its
    exception, or HangError when a step it marked outlives its limit (the thread, hung, is
    left behind as a daemon). Without a watchdog, fn() here."""
    if watchdog is None:
        return fn()
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as e:  # handed to the caller
            outcome["error"] = e

    thread = threading.Thread(target=body, name="nostall-watched", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(POLL_S)
        watchdog.check()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
