"""Where a run's prompts come from, drawn as TRL's sampler draws them (PromptSource): a built-in
task's generator (tasks.py), rows in memory (a `datasets.Dataset`, a list of dicts) or a local
dataset file or folder, text or conversational (TRL's {"role", "content"} messages), every
column besides `prompt` reaching the reward functions as keyword arguments."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PromptSource:
    """Rows of prompts with extra columns, drawn as TRL's sampler draws them: every row once an
    epoch, in an order shuffled anew each epoch (a batch may span two epochs); reproducibly
    from the seed. A task's generator instead draws a fresh prompt each time."""

    rows: list[dict]
    generate: Callable[[random.Random], tuple[str, str]] | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    order: list[int] = field(default_factory=list)  # this epoch's row order
    position: int = 0  # rows of `order` drawn
    epoch: int = 0  # epochs begun

    def seed(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.order, self.position, self.epoch = [], 0, 0

    def batch(self, n: int) -> list[dict]:
        if self.generate is not None:
            return [
                dict(zip(("prompt", "answer"), self.generate(self.rng), strict=True))
                for _ in range(n)
            ]
        drawn = []
        for _ in range(n):
            if self.position == len(self.order):  # a new epoch, in a new order
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
                self.position, self.epoch = 0, self.epoch + 1
            drawn.append(self.rows[self.order[self.position]])
            self.position += 1
        return drawn

    @property
    def columns(self) -> list[str]:
        """The columns besides `prompt` the reward functions get, every row's (a row without
        one gives None there, as TRL passes it)."""
        if self.generate is not None:
            return ["answer"]
        names: dict[str, None] = {}
        for row in self.rows:
            names.update(dict.fromkeys(k for k in row if k != "prompt"))
        return list(names)

    def all_prompts(self) -> list[str]:
        """Every prompt the source can give (for a dataset) or a sample (for a generator)."""
        if self.generate is not None:
            rng = random.Random(12345)
            return [self.generate(rng)[0] for _ in range(256)]
        return [row["prompt"] for row in self.rows]

    def state_dict(self) -> dict:
        return {
            "rng": self.rng.getstate(),
            "order": list(self.order),
            "position": self.position,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(_as_tuple(state["rng"]))
        # (A checkpoint from before epochs drew with replacement: it goes on with a new epoch.)
        self.order = [int(i) for i in state.get("order", [])]
        if any(not 0 <= i < len(self.rows) for i in self.order):
            raise ValueError(
                f"the checkpoint's prompt order names rows past the dataset's "
                f"{len(self.rows)}: it was saved with another dataset"
            )
        self.position = int(state.get("position", len(self.order)))
        self.epoch = int(state.get("epoch", 0))


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list | tuple) else x


def rows_source(rows, where: str) -> PromptSource:
    """Prompts from rows in memory: a `datasets.Dataset`, or a list of dicts, each with a
    string `prompt` column (other columns reach the reward functions as keyword arguments)."""
    if isinstance(rows, str | Path):
        return dataset_source(str(rows))
    try:
        rows = [dict(row) for row in rows]
    except (TypeError, ValueError):
        raise ValueError(
            f"{where} must be a datasets.Dataset, a list of dicts or a path, got "
            f"{type(rows).__name__}"
        ) from None
    return _checked(rows, where)


def is_conversation(prompt) -> bool:
    """A conversational prompt (TRL's format): a list of {"role", "content"} messages."""
    return (
        isinstance(prompt, list | tuple)
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in prompt
        )
        and len(prompt) > 0
    )


# The reward functions' own arguments: a column of one of these names would reach them twice.
REWARD_ARGUMENTS = ("prompts", "completions")


def _checked(rows: list[dict], where: str) -> PromptSource:
    if not rows:
        raise ValueError(f"dataset {where!r} holds no rows")
    kinds = set()
    for number, row in enumerate(rows, 1):
        taken = [name for name in REWARD_ARGUMENTS if name in row]
        if taken:
            raise ValueError(
                f"dataset {where}, row {number}: a column named {taken[0]!r} "
                f"would collide with the reward functions' argument "
                f"{taken[0]!r}; rename the column"
            )
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            kinds.add("text")
        elif is_conversation(prompt):
            kinds.add("conversation")
        else:
            raise ValueError(
                f"dataset {where}, row {number}: the `prompt` column must be a "
                'string or a conversation (a list of {"role", "content"} '
                f"messages), got {type(prompt).__name__}"
            )
    if len(kinds) > 1:
        raise ValueError(f"dataset {where} mixes text and conversational prompts")
    return PromptSource(rows=rows)


def completion_text(completion) -> str:
    """A completion's text: itself, or a conversational completion's last message's content."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def dataset_source(path: str) -> PromptSource:
    """Prompts from a local JSONL file (one object a line), a Parquet or CSV file, or a dataset
    saved with `datasets` (`save_to_disk`, a folder; a DatasetDict's `train` split): a `prompt`
    column, and any other columns passed to the reward functions as keyword arguments."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"dataset {path!r} does not exist")
    if p.is_dir() or p.suffix in (".parquet", ".csv"):
        return _checked(_datasets_rows(p), path)
    if p.suffix not in JSON_SUFFIXES:
        raise ValueError(
            f"dataset {path!r}: a JSONL file ({', '.join(JSON_SUFFIXES)}), a "
            "Parquet or CSV file, or a folder saved with datasets' "
            "save_to_disk"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"dataset {path!r} is not UTF-8 text ({e.reason} at byte {e.start}): "
            "a JSONL file is expected for this name"
        ) from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"dataset {path}, line {number}: not JSON ({e})") from None
        if not isinstance(row, dict):
            raise ValueError(f"dataset {path}, line {number}: not a JSON object")
        rows.append(row)
    return _checked(rows, path)


JSON_SUFFIXES = (".jsonl", ".json", "")


def _datasets_rows(p: Path) -> list[dict]:
    """Rows of a `save_to_disk` folder (a DatasetDict's `train` split, as TRL trains on) or of a
    Parquet or CSV file, read with the `datasets` package."""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"dataset {str(p)!r}: reading it needs the `datasets` package") from None
    if p.is_dir():
        loaded = datasets.load_from_disk(str(p))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise ValueError(
                    f"dataset {str(p)!r} holds the splits {sorted(loaded)}; its "
                    "`train` split is what a run reads"
                )
            loaded = loaded["train"]
    else:
        loaded = datasets.load_dataset(p.suffix[1:], data_files=str(p), split="train")
    return [dict(row) for row in loaded]
