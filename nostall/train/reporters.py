"""Where a run's log lines go besides the trainer's log_history, as transformers' `report_to`
names them: "tensorboard" (nostall's writer, output_dir/tensorboard/), "wandb" (Weights &
Biases) and "trackio" where the package is installed (a ValueError naming the package to install
otherwise), "all" (every one installed), "none". Each gets every log line, its metrics under
"train/", at the run's step."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

KNOWN = ("tensorboard", "wandb", "trackio")


def requested(report_to) -> list[str]:
    """The reporters `report_to` asks for (a name or a list); ValueError for an unknown name or
    one whose package is missing."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "all" in names:
        return [n for n in KNOWN if n == "tensorboard" or importlib.util.find_spec(n)]
    chosen = []
    for name in names:
        if name == "none":
            continue
        if name not in KNOWN:
            raise ValueError(
                f"report_to {name!r}: nostall reports to {', '.join(KNOWN)}, 'all' or 'none'"
            )
        if name != "tensorboard" and importlib.util.find_spec(name) is None:
            raise ValueError(f"report_to {name!r} needs the {name} package: pip install {name}")
        chosen.append(name)
    return chosen


class Reporters:
    """The run's reporters, fed by the training loop's log callback; `close` ends them."""

    def __init__(self, names: list[str], out_dir: str | None, run_name: str, config: dict):
        self.names, self.sinks = names, []
        for name in names:
            if name == "tensorboard":
                if out_dir is None:
                    raise ValueError("report_to 'tensorboard' writes into output_dir: give one")
                from torch.utils.tensorboard import SummaryWriter

                writer = SummaryWriter(str(Path(out_dir) / "tensorboard" / run_name))
                self.sinks.append((writer.add_scalar, writer.close, True))
            else:  # wandb and trackio share one API: init, log, finish
                module = importlib.import_module(name)
                module.init(project="huggingface", name=run_name, config=config)
                self.sinks.append((module.log, module.finish, False))

    def __call__(self, progress: int, metrics: dict[str, float]) -> None:
        self.write({f"train/{name}": value for name, value in metrics.items()}, progress)

    def evaluation(self, progress: int, metrics: dict[str, float]) -> None:
        """An evaluation's figures (eval_reward, ...) as transformers' reporters name them
        (eval/reward, ...)."""
        renamed = {name.replace("eval_", "eval/", 1): value for name, value in metrics.items()}
        self.write(renamed, progress)

    def write(self, scalars: dict[str, float], progress: int) -> None:
        for write, _, per_scalar in self.sinks:
            if per_scalar:
                for name, value in scalars.items():
                    write(name, value, progress)
            else:
                write(scalars, step=progress)

    def close(self) -> None:
        for _, close, _ in self.sinks:
            close()

    def joined(self, log):
        """A log callback feeding `log` (the caller's, or None) and these reporters."""
        if not self.sinks:
            return log
        if log is None:
            return self

        def both(progress: int, metrics: dict[str, float]) -> None:
            log(progress, metrics)
            self(progress, metrics)

        return both
