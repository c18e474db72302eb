"""Prompts and rewards for language-model RL.

Reward functions have TRL's signature, `fn(prompts, completions, **kwargs) -> list[float]`, so
a TRL user's reward function works unchanged: `prompts` and `completions` are lists of strings
(completions decoded up to the first `<eos>`, without special tokens), and every extra column
of the prompt source arrives as a keyword argument, one value per completion. With
conversational prompts (lists of {"role", "content"} messages, rendered with the tokenizer's
chat template), `prompts` are those lists and each completion is
`[{"role": "assistant", "content": text}]`, as TRL passes them.

Built-in verifiable tasks, each a prompt generator and a partial-credit reward (the share of
positions that match the answer, over the longer of completion and answer):
- `copy`: 5 letters from a-h then `=` (`efffb=`); the answer is the same letters (`efffb`);
- `reverse`: the letters reversed;
- `sort`: the letters sorted;
- `sum`: 4 digits then `=` (`3746=`); the answer is their sum in decimal (`20`);
- `arithmetic`: a two-step word problem (`7 apples, buy 5, eat 3. left=` -> `9`), rewarded for
  the right number (1) and for answering with a number alone (0.2); the built-in models read it
  with a tokenizer of its own alphabet (a-z, 0-9, space and `,.=`).
"""

from __future__ import annotations

import json
import math
import numbers
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nostall.user_code import import_user_module

RewardFn = Callable[..., list[float]]

LETTERS = "abcdefgh"


def partial_credit(completion: str, answer: str) -> float:
    """Positions where completion and answer agree, over the longer of the two."""
    longest = max(len(completion), len(answer))
    if longest == 0:
        return 0.0
    return sum(a == b for a, b in zip(completion, answer, strict=False)) / longest


def answer_reward(
    prompts: list[str], completions: list[str], answer: list[str], **_
) -> list[float]:
    """Partial credit against each row's `answer` column (the built-in tasks' reward); text or
    conversational completions."""
    return [partial_credit(completion_text(c), a) for c, a in zip(completions, answer, strict=True)]


def _letters(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(n))


def _digits(rng: random.Random, n: int = 4) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def word_problem(rng: random.Random) -> tuple[str, str]:
    """A two-step arithmetic word problem and its answer: `7 apples, buy 5, eat 3. left=` ->
    `9` (never below zero)."""
    item = rng.choice(["apples", "pears", "cakes", "coins", "books"])
    have, gain = rng.randint(1, 9), rng.randint(1, 9)
    lose = rng.randint(0, min(9, have + gain))
    verbs = {
        "apples": ("buy", "eat"),
        "pears": ("pick", "eat"),
        "cakes": ("bake", "sell"),
        "coins": ("find", "spend"),
        "books": ("get", "lend"),
    }[item]
    return f"{have} {item}, {verbs[0]} {gain}, {verbs[1]} {lose}. left=", str(have + gain - lose)


def number_reward(prompts: list, completions: list, answer: list[str], **_) -> list[float]:
    """1 where the completion is the answer (surrounding spaces aside), else 0."""
    return [
        float(completion_text(c).strip() == a) for c, a in zip(completions, answer, strict=True)
    ]


def digits_format_reward(prompts: list, completions: list, **_) -> list[float]:
    """1 where the completion is a number alone (the format an answer is read in), else 0."""
    return [float(completion_text(c).strip().isdigit()) for c in completions]


TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "copy": lambda rng: (lambda s: (s + "=", s))(_letters(rng)),
    "reverse": lambda rng: (lambda s: (s + "=", s[::-1]))(_letters(rng)),
    "sort": lambda rng: (lambda s: (s + "=", "".join(sorted(s))))(_letters(rng)),
    "sum": lambda rng: (lambda s: (s + "=", str(sum(map(int, s)))))(_digits(rng)),
    "arithmetic": word_problem,
}
# A task's own rewards and weights (the others: partial credit against the answer).
TASK_REWARDS: dict[str, tuple[list[RewardFn], list[float]]] = {
    "arithmetic": ([number_reward, digits_format_reward], [1.0, 0.2]),
}
# The alphabet a built-in model's tokenizer needs for a task (the others: a-h, 0-9, =).
TASK_CHARACTERS: dict[str, list[str]] = {
    "arithmetic": sorted(set(string.ascii_lowercase + string.digits + " ,.=")),
}


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


def task_source(name: str) -> PromptSource:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; built-in tasks: {', '.join(TASKS)}")
    return PromptSource(rows=[], generate=TASKS[name])


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


def load_reward(spec: str) -> RewardFn:
    """`module:function`, imported."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward {spec!r} must be given as module:function")
    try:
        module = import_user_module(module_name)
    except ImportError as e:
        where = "looked among the installed modules, then in the working directory"
        raise ValueError(f"reward {spec!r}: cannot import {module_name!r} ({e}; {where})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward {spec!r}: {module_name} has no function {attr!r}")
    return fn


class Rewards:
    """Weighted reward functions over a batch, checked: each must return one finite number per
    completion, or the run stops with a message naming it."""

    def __init__(self, functions: Sequence[RewardFn], weights: Sequence[float] | None = None):
        if not functions:
            raise ValueError("at least one reward function is needed")
        weights = [1.0] * len(functions) if not weights else list(weights)
        if len(weights) != len(functions):
            raise ValueError(f"{len(weights)} reward weights for {len(functions)} reward functions")
        self.functions, self.weights = list(functions), weights
        self.names = _unique([getattr(fn, "__name__", type(fn).__name__) for fn in functions])
        # The last call's values of each function (NaN where it returned None), by name.
        self.per_function: dict[str, list[float]] = {}

    def __call__(
        self,
        prompts: list,
        completions: list,
        columns: dict,
        watchdog=None,
        timeout_s: float | None = None,
    ) -> list[float]:
        """The weighted sum over the functions of each completion's rewards. As in TRL, None
        (or NaN) from a function means "not applicable": it adds nothing (TRL's nansum), and
        a completion no function applies to gets 0. With a `watchdog`, each call is marked
        with `timeout_s` as its limit (a hung function is then named)."""
        total = [0.0] * len(completions)
        self.per_function = {}
        for fn, weight, name in zip(self.functions, self.weights, self.names, strict=True):
            if watchdog is not None:
                watchdog.doing(f"reward function {name}", timeout_s, "reward_timeout")
            values = fn(prompts=prompts, completions=completions, **columns)
            if hasattr(values, "tolist"):  # a NumPy array or a tensor
                values = values.tolist()  # sync: the reward's own output, read once a batch
            if not isinstance(values, list | tuple) or len(values) != len(completions):
                got = len(values) if isinstance(values, list | tuple) else type(values).__name__
                raise ValueError(
                    f"reward function {name} returned {got} values for {len(completions)} "
                    "completions (it must return one float per completion)"
                )
            raw = self.per_function[name] = [math.nan] * len(completions)
            for i, v in enumerate(values):
                if v is None:
                    continue
                if not isinstance(v, numbers.Real):  # (NumPy's scalars are, strings not)
                    raise ValueError(
                        f"reward function {name} returned {v!r} for completion "
                        f"{i} (a number or None, not a string or another "
                        "type)"
                    )
                v = float(v)
                if math.isnan(v):
                    continue
                if math.isinf(v):
                    raise ValueError(f"reward function {name} returned {v!r} for completion {i}")
                raw[i] = v
                total[i] += weight * v
        return total


def _unique(names: list[str]) -> list[str]:
    """Names with a suffix where two functions share one (`f`, `f_2`), as metrics keys."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out
