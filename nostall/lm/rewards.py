"""Reward functions for language-model RL, with TRL's signature, `fn(prompts, completions,
**kwargs) -> list[float]`, so a TRL user's reward function works unchanged: `prompts` and
`completions` are lists of strings (completions decoded up to the first `<eos>`, without
special tokens), and every extra column of the prompt source arrives as a keyword argument, one
value per completion. With conversational prompts (lists of {"role", "content"} messages,
rendered with the tokenizer's chat template), `prompts` are those lists and each completion is
`[{"role": "assistant", "content": text}]`, as TRL passes them. Rewards weighs and checks them;
load_reward imports one named `module:function`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

from nostall.user_code import import_named

RewardFn = Callable[..., list[float]]


def load_reward(spec: str) -> RewardFn:
    """`module:function`, imported; or a reward model's directory or cached Hub id, loaded
    (nostall.lm.reward_models)."""
    from nostall.lm.reward_models import RewardModel, names_a_model

    if names_a_model(spec):
        try:
            return RewardModel.load(spec)
        except ValueError as e:
            raise ValueError(
                f"reward {spec!r} must be given as module:function, or be a reward model's "
                f"directory or cached Hub id ({e})"
            ) from None
    return import_named(spec, "reward")


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
