"""Sync reports: events grouped by source line and kind, as a readable table or JSON."""

from __future__ import annotations

import linecache
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class SyncEvent:
    kind: str
    file: str
    line: int
    function: str
    step: int
    allowed: bool
    reason: str | None
    caller: tuple[str, int] | None = None  # the nearest user line, when file is a library's


@dataclass
class SyncSite:
    """One source line and kind, with how often it synced."""

    file: str
    line: int
    kind: str
    count: int
    steps_with_sync: int
    per_step: float | None
    reason: str | None = None
    code: str = ""
    hint: str = ""  # what removes this kind of sync
    library: bool = False  # the line is an installed package's, not the user's
    called_from: str | None = None  # the user's line that led to it (a library site)

    @property
    def location(self) -> str:
        return f"{_short(self.file)}:{self.line}"


@dataclass
class SyncReport:
    steps: int
    unintended: list[SyncSite] = field(default_factory=list)
    intended: list[SyncSite] = field(default_factory=list)
    cuda_warnings_unmatched: list[tuple[str, int]] = field(default_factory=list)
    idle: dict | None = None
    bound: Any = None  # a bound.BoundBy, when a trace was recorded

    @classmethod
    def from_events(
        cls,
        events: list[SyncEvent],
        steps: int,
        cuda_warnings: list[tuple[str, int]] = (),
        only_user_code: bool = False,
    ) -> SyncReport:
        """Groups events by line, kind and calling user line. With `only_user_code`, a sync in
        an installed library is reported at the user's line that led to it."""
        from nostall.profiler.catalog import HINTS, is_library

        if only_user_code:
            events = [
                replace(e, file=e.caller[0], line=e.caller[1], function="", caller=None)
                if e.caller is not None
                else e
                for e in events
            ]
        report = cls(steps=steps)
        groups: dict[tuple, list[SyncEvent]] = defaultdict(list)
        for e in events:
            groups[(e.allowed, e.file, e.line, e.kind, e.reason, e.caller)].append(e)
        for (allowed, file, line, kind, reason, caller), group in groups.items():
            site = SyncSite(
                file=file,
                line=line,
                kind=kind,
                count=len(group),
                steps_with_sync=len({e.step for e in group}),
                per_step=len(group) / steps if steps else None,
                reason=reason,
                code=linecache.getline(file, line).strip(),
                hint=HINTS.get(kind, ""),
                library=is_library(file),
                called_from=None if caller is None else f"{_short(caller[0])}:{caller[1]}",
            )
            (report.intended if allowed else report.unintended).append(site)
        for sites in (report.unintended, report.intended):
            # The user's own lines first, then the libraries', most frequent first in each.
            sites.sort(key=lambda s: (s.library, -s.count, s.file, s.line))
        seen = {(e.file, e.line) for e in events}
        report.cuda_warnings_unmatched = [w for w in cuda_warnings if w not in seen]
        return report

    @property
    def unintended_count(self) -> int:
        return sum(s.count for s in self.unintended)

    @property
    def intended_count(self) -> int:
        return sum(s.count for s in self.intended)

    def counts_by_kind(self) -> dict[str, int]:
        """Unintended syncs per kind."""
        return dict(_sum_by_kind(self.unintended))

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "unintended_syncs": self.unintended_count,
            "intended_syncs": self.intended_count,
            "unintended": [asdict(s) for s in self.unintended],
            "intended": [asdict(s) for s in self.intended],
            "cuda_warnings_unmatched": [list(w) for w in self.cuda_warnings_unmatched],
            "idle": self.idle,
            "bound_by": self.bound.to_dict() if self.bound is not None else None,
        }

    def table(self) -> str:
        steps = f" over {self.steps} steps" if self.steps else ""
        lines = [
            f"nostall sync report: {self.unintended_count} unintended sync(s) at "
            f"{len(self.unintended)} site(s), {self.intended_count} intended{steps}"
        ]
        if self.unintended:
            lines.append(_rows(self.unintended, "unintended"))
        if self.intended:
            lines.append(_rows(self.intended, "intended"))
        if self.cuda_warnings_unmatched:
            lines.append("CUDA sync debug mode also flagged (not matched to a site above):")
            lines += [f"  {_short(f)}:{n}" for f, n in self.cuda_warnings_unmatched]
        if self.idle is not None:
            lines.append(format_idle(self.idle))
        if self.bound is not None:
            lines.append(self.bound.table())
        return "\n".join(lines)


def _sum_by_kind(sites: list[SyncSite]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for s in sites:
        totals[s.kind] += s.count
    return totals


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _rows(sites: list[SyncSite], title: str) -> str:
    out = [f"  {title}:", f"  {'count':>7} {'per step':>9}  {'kind':<34} location"]
    library = False
    for s in sites:
        if s.library and not library:
            out.append("  in installed libraries (each with the line of yours that called it):")
            library = True
        per_step = f"{s.per_step:9.2f}" if s.per_step is not None else f"{'-':>9}"
        kind = s.kind if s.reason is None else f"{s.kind} ({s.reason})"
        code = s.code if len(s.code) <= 60 else s.code[:57] + "..."
        out.append(f"  {s.count:7d} {per_step}  {kind:<34} {s.location}  {code}")
        if s.called_from:
            out.append(f"  {'':18}  called from {s.called_from}")
        if s.hint and s.reason is None:
            out.append(f"  {'':18}  fix: {s.hint}")
    return "\n".join(out)


def format_idle(idle: dict) -> str:
    """The device idle breakdown of a trace analysis (see trace.py) as text."""
    if not idle.get("streams"):
        return "device idle breakdown: the trace holds no device activity"
    lines = [
        f"device idle breakdown ({idle['window_us'] / 1e3:.2f} ms window, "
        f"device busy {idle['busy_us'] / 1e3:.2f} ms, idle {idle['idle_us'] / 1e3:.2f} ms):"
    ]
    for s in idle["streams"]:
        lines.append(
            f"  stream {s['device']}:{s['stream']}: busy {s['busy_us'] / 1e3:.2f} ms, idle "
            f"{s['idle_us'] / 1e3:.2f} ms = host wait {s['host_wait_us'] / 1e3:.2f} + kernel "
            f"wait {s['kernel_wait_us'] / 1e3:.2f} + other {s['other_us'] / 1e3:.2f}"
        )
    for gap in idle.get("host_wait_causes", [])[:10]:
        where = gap["source"] or "no stack in trace"
        lines.append(
            f"  host wait {gap['idle_us'] / 1e3:8.3f} ms after {gap['sync_call']} ({where})"
        )
    return "\n".join(lines)
