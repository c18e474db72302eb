"""The process transport's child (ProcessLoop's rollout side, for any fill): spawned, watched
and stopped.

Failure, both ways, within about a second:
- the child's exception reaches the trainer with the child's traceback (a death without one is
  reported with the exit code, after the error queue is drained);
- a child that stops making progress (stopped, deadlocked) is reported after
  `liveness_timeout_s` without a heartbeat, or, inside a step its side marked on the shared
  watchdog (a reward call, a decode step), after that step's own limit, naming it;
- the child exits within a poll interval of its parent's death (it checks its parent at every
  heartbeat), and leaving the trainer's `with` block stops and joins it, or terminates it.
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from collections.abc import Callable

from nostall.runtime.queue import RuntimeStopped
from nostall.runtime.watchdog import HangError, Watchdog

POLL_S = 0.05
# Spawning a child and importing torch (and transformers) take seconds: a child that has not
# beaten once is given at least this long.
START_TIMEOUT_S = 120.0


class ParentGone(Exception):
    """Raised in the child when its trainer process is gone."""


class Heartbeat:
    """The child's side: each call marks it alive and checks that its parent still is. Its
    `watchdog` is the one the child's side marks its steps on (shared with the trainer)."""

    def __init__(self, value, parent_pid: int, watchdog: Watchdog):
        self._value, self._parent_pid, self.watchdog = value, parent_pid, watchdog

    def __call__(self) -> None:
        self._value.value = time.monotonic()
        if os.getppid() != self._parent_pid:  # the trainer died: nobody will read our chunks
            raise ParentGone


def run_child(main: Callable[[Heartbeat], None], heartbeat: Heartbeat, errors, stop) -> None:
    """The child's body around `main(heartbeat)`: its failure goes to the trainer with its
    traceback; an orphan exits at once."""
    try:
        main(heartbeat)
    except ParentGone:
        pass
    except BaseException as e:
        errors.put(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        stop.set()
        return  # the interpreter's exit flushes the error to the trainer
    # Stopped (or orphaned): exit now, skipping the interpreter's teardown (one to two seconds
    # with torch and transformers loaded, which the trainer's `with` block would wait for).
    # Nothing here needs it: the trainer owns the shared memory, and no one wants the chunks
    # still in the queues.
    os._exit(0)


class ChildProcess:
    """The trainer's side: the child's liveness, its errors, its stop flag and its end."""

    def __init__(self, ctx, *, join_timeout_s: float, liveness_timeout_s: float):
        self._ctx = ctx
        self.heartbeat_value = ctx.Value("d", 0.0)  # the child's last sign of life (monotonic s)
        self.watchdog = Watchdog(ctx)  # the step the child is in, and its limit
        self.errors = ctx.Queue()
        self.stop = ctx.Event()
        self.parent_pid = os.getpid()
        self.join_timeout_s = join_timeout_s
        self.liveness_timeout_s = liveness_timeout_s
        self.process = None
        self._started_at = 0.0

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(self.heartbeat_value, self.parent_pid, self.watchdog)

    def start(self, target: Callable, args: tuple) -> None:
        self.heartbeat_value.value = 0.0  # the child's first beat marks it started
        self._started_at = time.monotonic()
        self.process = self._ctx.Process(
            target=target, args=args, name="nostall-rollout", daemon=True
        )
        self.process.start()

    def error(self, wait_s: float = 0.0) -> str | None:
        try:
            return self.errors.get(timeout=wait_s) if wait_s else self.errors.get_nowait()
        except queue.Empty:
            return None

    def check(self) -> None:
        """Raises RuntimeStopped with the cause if the child failed, died or went silent."""
        if self.process is None:
            raise RuntimeStopped("the rollout process was not started (use `with runtime:`)")
        message = self.error()
        if message is None and not self.process.is_alive():
            # A dying child's last message may still be in flight: give it a moment.
            message = self.error(wait_s=0.5)
            if message is None:
                raise RuntimeStopped(
                    f"the rollout process exited unexpectedly (exit code "
                    f"{self.process.exitcode}) without an error message"
                )
        if message is not None:
            raise RuntimeStopped(f"the rollout process failed: {message}")
        beat = self.heartbeat_value.value
        if beat == 0.0:  # not started yet
            limit = max(self.liveness_timeout_s, START_TIMEOUT_S)
            if time.monotonic() - self._started_at > limit:
                raise RuntimeStopped(
                    f"the rollout process (pid {self.process.pid}) did not start within "
                    f"{limit:.0f} s"
                )
            return
        if self.watchdog.busy:  # inside a step it marked: that step's own limit applies
            try:
                self.watchdog.check()
            except HangError as e:
                raise HangError(f"the rollout process (pid {self.process.pid}): {e}") from None
            return
        silent = time.monotonic() - max(beat, self.watchdog.last_beat)
        if silent > self.liveness_timeout_s:
            raise RuntimeStopped(
                f"the rollout process (pid {self.process.pid}) made no progress for "
                f"{silent:.1f} s (stopped or hung); liveness timeout {self.liveness_timeout_s} s"
            )

    def get(self, q):
        """The next item of a queue the child fills, checking on the child while waiting."""
        while True:
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                self.check()

    def close(self, failed: bool) -> None:
        """Stops and joins the child (terminating it if it does not stop); a failure it
        reported late is raised when the trainer side did not fail itself."""
        self.stop.set()
        if self.process is None:
            return
        # After a failure the child may be the reason (stopped, hung): do not wait long for it,
        # the user is waiting for the error.
        self.process.join(timeout=0.5 if failed else self.join_timeout_s)
        if self.process.is_alive():  # hung, or stopped (SIGSTOP): SIGTERM, then SIGKILL
            self.process.terminate()
            self.process.join(timeout=0.5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        late = self.error()
        if not failed and late is not None:
            raise RuntimeStopped(f"the rollout process failed: {late}")

    def state_at_next_wait(self, requests, responses, filled, received: int) -> tuple[dict, list]:
        """For a checkpoint: asks the child for its state at its next wait for a policy version
        (it stays there until the trainer publishes), then receives every chunk it filled before
        that and the trainer has not received yet (`received` of its `chunks_collected` were;
        a put may still be in flight, so each is waited for, by count). Returns (state, the
        filled queue's messages, in order): they stay on the trainer's side rather than go back
        into the queue, where the child's next put could overtake them."""
        requests.put("state")
        state = self.get(responses)
        return state, [self.get(filled) for _ in range(state["chunks_collected"] - received)]
