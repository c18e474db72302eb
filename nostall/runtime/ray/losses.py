"""What a Ray worker's death costs the run: the requests lost with it (counted, with their
causes, never trained on), the wait for Ray to bring it back before it is asked again, and its
streams (prompts, environments, sampling generator) restored to where its last delivered chunk
left them, so the restarted worker goes on rather than replaying from its seed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class WorkerLoss:
    """Requests lost with their workers (counted, never trained on), and what each worker's
    side state was after the last chunk it delivered: `sides[w]` is (seq, state), with state
    None where the side cannot be saved (`unsaved[w]` says why; it restarts from its seed)."""

    dropped: int = 0
    causes: list[str] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)  # how each restarted worker went on
    sides: dict[int, tuple[int, dict | None]] = field(default_factory=dict)
    unsaved: dict[int, str] = field(default_factory=dict)

    def delivered(self, result: dict) -> dict:
        """Takes the side state a worker sent with its chunk (kept if its newest); returns the
        result without it."""
        worker, seq = result["worker"], result["seq"]
        side, why = result.pop("side", None), result.pop("side_unsaved", None)
        if why is not None:
            self.unsaved[worker] = why
        if seq > self.sides.get(worker, (-1, None))[0]:
            self.sides[worker] = (seq, side)
        return result

    def resumed(self, workers: list[dict]) -> None:
        """A checkpoint's worker states: where each worker's streams stand before its first
        chunk of this run."""
        self.sides = {w: (-1, saved.get("side")) for w, saved in enumerate(workers)}

    def lost(self, worker: int, seq: int, error: Exception) -> None:
        self.dropped += 1
        self.causes.append(f"worker {worker} chunk {seq}: {type(error).__name__}")

    def restore(self, ray, handle, worker: int, timeout_s: float) -> None:
        """Loads the restarted `worker`'s side with its state after its last delivered chunk
        (Ray rebuilt it from its recipe and seed); a side that cannot be saved, or one that has
        delivered nothing in a fresh run, starts from its seed, and the report says which."""
        seq, side = self.sides.get(worker, (-1, None))
        if side is not None:
            for attempt in range(3):  # (a call right after the restart may meet it "unavailable")
                try:
                    ray.get(handle.restore_side.remote(side), timeout=timeout_s)
                    break
                except ray.exceptions.ActorUnavailableError:
                    if attempt == 2:
                        raise
                    await_restart(ray, handle, f"worker {worker}", timeout_s)
            after = f"after chunk {seq}" if seq >= 0 else "at the checkpoint"
            self.restarts.append(f"worker {worker} restarted; its streams resumed {after}")
        elif worker in self.unsaved:
            self.restarts.append(
                f"worker {worker} restarted from its seed: its side cannot be "
                f"saved ({self.unsaved[worker]})"
            )
        else:  # nothing delivered yet: its seed is where its streams stood
            self.restarts.append(f"worker {worker} restarted at its start")


def await_restart(ray, worker, name: str, timeout_s: float, poll_s: float = 0.2) -> None:
    """Blocks until Ray has restarted `worker` (an actor handle) and its side is built again
    (a vLLM engine takes seconds): a request sent meanwhile would fail at once, as "temporarily
    unavailable", and be lost too. RuntimeError naming `name` if it is not back in `timeout_s`
    or is gone for good (out of restarts)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(worker.ready.remote(), timeout=max(deadline - time.monotonic(), 0.1))
            return
        except ray.exceptions.ActorUnavailableError:  # (restarting)
            if time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        except ray.exceptions.GetTimeoutError:
            break
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"Ray rollout {name} died and was not restarted: {e}") from e
    raise RuntimeError(f"Ray rollout {name} was not restarted within {timeout_s:g} s")
