"""What a Ray worker's death costs the run: the requests lost with it (counted, with their
causes, never trained on), and the wait for Ray to bring it back before it is asked again."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class WorkerLoss:
    """Requests lost with their workers: counted, never trained on."""

    dropped: int = 0
    causes: list[str] = field(default_factory=list)


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
