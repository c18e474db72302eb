"""The loop's hooks every trainer has alike (loop.Hooks): written once, taken by each."""

from __future__ import annotations

from pathlib import Path

from nostall.train.result import TrainResult


class WritesOutputs:
    """`completed`: the run's outputs (report, plots, model) written into `config.output_dir`
    by the trainer's `write_outputs`; nothing where the run has no folder."""

    def completed(self, result: TrainResult) -> None:
        if self.config.output_dir:
            self.write_outputs(Path(self.config.output_dir))
