"""eval_strategy's evaluations beside training (eval_overlap): each runs on a thread of its own
over a copy of the weights of the step it follows, while the trainer goes on with the next
steps. One at a time (one copy of the weights): asking for another waits for the one running.
A finished evaluation is logged on the trainer's thread at the next step's end, under the step
it evaluated (log_history entries carry their step; TRL's position of the entry is right after
that step's, nostall's is where it finished). A checkpoint and the run's end wait for the one
running, so a checkpoint's log_history holds every evaluation asked before it and a resumed
run repeats none. An evaluation that fails stops the run with its cause; a run that stops
otherwise cancels the one running (between its generation batches) and joins its thread."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch


class EvaluationFailed(RuntimeError):
    """An evaluation beside training raised: its step and cause."""


@dataclass
class _Running:
    asked: tuple  # (the step, global step and epoch evaluated)
    thread: threading.Thread | None = None
    outcome: object = None  # the figures, or the exception raised


class OverlappedEval:
    """`evaluate(model, cancelled) -> figures | None` runs on the thread (None once
    cancelled); `log(figures, asked)` runs on the trainer's, `asked` as `start` was given it
    (the step, global step and epoch evaluated)."""

    def __init__(
        self,
        evaluate: Callable[[torch.nn.Module, threading.Event], dict | None],
        log: Callable[[dict, tuple], None],
    ):
        self._evaluate, self._log = evaluate, log
        self._running: _Running | None = None
        self._cancel = threading.Event()

    def start(self, model: torch.nn.Module, asked: tuple) -> None:
        """An evaluation of `model` as it is now (copied here, on the trainer's thread, before
        the next update changes it), after the one running is logged."""
        self.wait()
        with torch.no_grad():
            weights = copy.deepcopy(model)
        self._cancel.clear()
        running = _Running(asked)

        def work() -> None:
            try:
                running.outcome = self._evaluate(weights, self._cancel)
            except BaseException as error:  # reported on the trainer's thread
                running.outcome = error

        running.thread = threading.Thread(target=work, name=f"nostall-eval-{asked[0]}", daemon=True)
        self._running = running
        running.thread.start()

    def poll(self) -> None:
        """Logs the evaluation running if it has finished (never waits)."""
        if self._running is not None and not self._running.thread.is_alive():
            self.wait()

    def wait(self) -> None:
        """Waits for the evaluation running, if any, and logs it; EvaluationFailed (with its
        cause) where it raised."""
        running, self._running = self._running, None
        if running is None:
            return
        running.thread.join()
        outcome = running.outcome
        if isinstance(outcome, BaseException):
            raise EvaluationFailed(
                f"the evaluation after step {running.asked[0]} failed: "
                f"{type(outcome).__name__}: {outcome}"
            ) from outcome
        if outcome is not None:
            self._log(outcome, running.asked)

    def close(self) -> None:
        """The run stops (an error, an interrupt): the evaluation running is cancelled and its
        thread joined; nothing is logged."""
        running, self._running = self._running, None
        if running is not None:
            self._cancel.set()
            running.thread.join()

    @property
    def asked(self) -> tuple | None:
        """What the evaluation running was asked for (None: none runs)."""
        return None if self._running is None else self._running.asked
