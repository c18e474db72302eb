"""A logging window: each figure's mean over the steps since the last log line, as TRL's
trainer logs them (its metrics are lists it averages and clears at each log; transformers'
loss is the window's mean too). The sums stay on the figures' device until the logged step
reads them: adding a step's figures waits on nothing. A run keeps one sum a figure, whatever
its length."""

from __future__ import annotations

import torch


class LogWindow:
    """Sums and counts of each figure since the last `means()`. `last_only` names figures
    logged as the last step's value (transformers' grad_norm), not a mean."""

    def __init__(self, last_only: tuple[str, ...] = ()):
        self.last_only = frozenset(last_only)
        self._sums: dict[str, torch.Tensor | float] = {}
        self._counts: dict[str, int] = {}

    def add(self, figures: dict[str, torch.Tensor | float]) -> None:
        """One step's figures (tensors, read later, or host numbers); a figure a step did not
        measure is averaged over the steps that did."""
        for name, value in figures.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().to(torch.float64, copy=True)  # (the window's own)
            if name in self.last_only or name not in self._sums:
                self._sums[name], self._counts[name] = value, 1
            else:
                self._sums[name] = self._sums[name] + value
                self._counts[name] += 1

    def means(self) -> dict[str, torch.Tensor | float]:
        """Each figure's mean over the window (tensors stay tensors: nothing is read here),
        and the window emptied."""
        means = {name: total / self._counts[name] for name, total in self._sums.items()}
        self._sums, self._counts = {}, {}
        return means

    def state_dict(self) -> dict:
        """The open window as host numbers, for a checkpoint (a resumed run's first log line
        averages the same steps as the uninterrupted run's)."""
        with torch.no_grad():
            sums = {  # sync: a checkpoint is written (host numbers) at this boundary anyway
                name: float(total) for name, total in self._sums.items()
            }
        return {"sums": sums, "counts": dict(self._counts)}

    def load_state_dict(self, state: dict) -> None:
        self._sums = {name: float(total) for name, total in state.get("sums", {}).items()}
        self._counts = {name: int(count) for name, count in state.get("counts", {}).items()}
