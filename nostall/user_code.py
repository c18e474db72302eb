"""Code the user names ("module:function" rewards, "module:Class" environments), imported from
the working directory as well as from the installed packages, without letting a file in the
working directory stand in for an installed module.

A console script does not put the working directory on `sys.path` (and `python -m` puts it
first, where a stray `json.py` or `datasets.py` would replace the real module in every later
import, in child processes too). Here it goes last: a module the user wrote is found there,
and an installed one is always the one imported under its name."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from types import ModuleType


def working_directory_last() -> None:
    """The working directory on `sys.path` after every installed package (moved there when
    `python -m` put it first), so that a child process, which inherits the path, finds the
    user's modules too and never shadows an installed one."""
    here = os.getcwd()
    entries = [p for p in sys.path if (os.path.abspath(p) if p else here) != here]
    sys.path[:] = [*entries, here]


def import_user_module(name: str) -> ModuleType:
    """The module `name`, an installed one before one in the working directory."""
    working_directory_last()
    return importlib.import_module(name)


def import_named(
    spec: str, label: str, form: str = "module:function", kind: str = "function"
) -> Callable:
    """The callable `spec` ("module:name") names, its module imported as import_user_module
    does; ValueError naming `label` (the flag or argument) and what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{label} {spec!r} must be given as {form}")
    try:
        module = import_user_module(module_name)
    except ImportError as e:
        where = "looked among the installed modules, then in the working directory"
        raise ValueError(
            f"{label} {spec!r}: cannot import {module_name!r} ({e}; {where})"
        ) from None
    found = getattr(module, attr, None)
    if not callable(found):
        raise ValueError(f"{label} {spec!r}: {module_name} has no {kind} {attr!r}")
    return found
