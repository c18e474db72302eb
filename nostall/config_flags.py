"""Command-line flags generated from a config dataclass: one flag a field (`num_envs` ->
`--num-envs`), its type from the annotation, its help from the docstring under the field
(CleanRL's habit), so the command and the Python API take the same settings by the same
names."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import re
import typing


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of an Args dataclass (and its bases), CleanRL-style."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
            ):
                docs[node.target.id] = str(after.value.value)
    return docs


def _integer(text: str) -> int:
    """An int, also written as a whole float (`1e5`, `2.0e6`): step counts are written so."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(value)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


_PARSERS = {int: _integer, float: _number}


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """A flag a field of `cls`: its own fields first, then those it inherits (RunConfig's, every
    run's settings), each base's under a heading of its own."""
    docs = _field_docs(cls)
    hints = typing.get_type_hints(cls)
    # A class that only sets other defaults (GRPOCommandConfig) lists its fields where its
    # base would: the base's own first.
    layout = cls
    while set(layout.__annotations__) <= {f.name for f in dataclasses.fields(layout.__mro__[1])}:
        layout = layout.__mro__[1]
    inherited = {
        f.name: klass
        for klass in layout.__mro__[1:]
        if dataclasses.is_dataclass(klass)
        for f in dataclasses.fields(klass)
    }
    groups: dict[type, argparse._ArgumentGroup] = {}
    own = [f for f in dataclasses.fields(cls) if f.name not in inherited]
    # (the nearest base's first: APPO's own, PPO's, then every run's)
    rest = [f for f in dataclasses.fields(cls) if f.name in inherited]
    rest.sort(key=lambda f: layout.__mro__.index(inherited[f.name]))
    for f in own + rest:
        target = parser
        if f.name in inherited:
            klass = inherited[f.name]
            if klass not in groups:
                title = re.split(r"[;,]", klass.__doc__ or klass.__name__)[0].strip()
                groups[klass] = parser.add_argument_group(title)
            target = groups[klass]
        _add_flag(target, f, hints[f.name], docs.get(f.name, ""))


def _add_flag(parser, f: dataclasses.Field, hint, doc: str) -> None:
    flag = "--" + f.name.replace("_", "-")
    help_text = f"{doc} (default: {f.default})"
    base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    if base is bool:
        parser.add_argument(
            flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
        )
        return
    parser.add_argument(flag, type=_PARSERS.get(base, base), default=f.default, help=help_text)


def config_from(namespace: argparse.Namespace, cls: type):
    """The `cls` config of the parsed flags (other flags ignored)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(namespace).items() if k in names})
