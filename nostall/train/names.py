"""A trainer's config refuses a setting it does not have by name, with the closest it has: a
script written for another library (TRL's `max_steps`, SB3's `n_steps`) learns what to write
instead of meeting Python's bare "unexpected keyword argument"."""

from __future__ import annotations

import dataclasses
import difflib
import functools


def refuses_unknown_names(cls: type) -> type:
    """Wraps a dataclass's generated __init__: ValueError naming each unknown keyword. A class
    with `outside_names` (another library's names that are not its fields) takes those too,
    handing them to its `take_outside(dict)` after __init__."""
    init = cls.__init__
    outside = getattr(cls, "outside_names", frozenset())
    names = sorted({f.name for f in dataclasses.fields(cls) if f.init} | outside)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        taken = {name: kwargs.pop(name) for name in list(kwargs) if name in outside}
        unknown = [name for name in kwargs if name not in names]
        if unknown:
            parts = []
            for name in unknown:
                close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
                hint = f" (closest: {', '.join(close)})" if close else ""
                parts.append(f"{name!r}{hint}")
            raise ValueError(
                f"{cls.__name__} has no setting {'; '.join(parts)}; its settings "
                f"are the fields of {cls.__name__}, the command's flags"
            )
        init(self, *args, **kwargs)
        if outside:
            self.take_outside(taken)

    cls.__init__ = __init__
    return cls
