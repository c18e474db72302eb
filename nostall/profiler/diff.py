"""What a change did to a script's syncs: two `nostall profile --json` reports compared site by
site, for review or CI (`nostall profile --diff before.json after.json`).

A site is matched by file, kind and the text of its line, not the line number: a fix elsewhere in
the file moves lines without changing what syncs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass
class SiteChange:
    location: str  # file:line in the report it comes from (after's when in both)
    kind: str
    code: str
    before: int  # syncs counted (0: not in that report)
    after: int


@dataclass
class SyncDiff:
    before_total: int
    after_total: int
    changes: list[SiteChange]

    @property
    def added(self) -> list[SiteChange]:
        return [c for c in self.changes if c.before == 0]

    @property
    def removed(self) -> list[SiteChange]:
        return [c for c in self.changes if c.after == 0]

    def table(self) -> str:
        lines = [
            f"nostall sync diff: {self.before_total} -> {self.after_total} unintended syncs, "
            f"{len(self.added)} site(s) added, {len(self.removed)} removed"
        ]
        for sign, title, sites in (("+", "added", self.added), ("-", "removed", self.removed)):
            if sites:
                lines.append(f"  {title}:")
                lines += [
                    f"  {sign} {c.before or c.after:7d}  {c.kind:<34} {c.location}  {c.code}"
                    for c in sites
                ]
        changed = [c for c in self.changes if c.before and c.after and c.before != c.after]
        if changed:
            lines.append("  changed:")
            lines += [
                f"  ~ {c.before:7d} -> {c.after:<7d} {c.kind:<34} {c.location}  {c.code}"
                for c in changed
            ]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "before_total": self.before_total,
            "after_total": self.after_total,
            "changes": [vars(c) for c in self.changes],
        }


def load(path: str | os.PathLike) -> dict:
    """A report written by `nostall profile --json`; ValueError naming the file otherwise."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read a sync report from {path}: {e}") from e
    if not isinstance(report, dict) or not isinstance(report.get("unintended"), list):
        raise ValueError(f"{path} is not a `nostall profile --json` report (no 'unintended' list)")
    return report


def _sites(report: dict) -> dict[tuple, dict]:
    sites: dict[tuple, dict] = {}
    for s in report["unintended"]:
        key = (s.get("file"), s.get("kind"), s.get("code") or s.get("line"), s.get("called_from"))
        if key in sites:  # the same text on two lines of one file: add them up
            sites[key] = {**sites[key], "count": sites[key]["count"] + s["count"]}
        else:
            sites[key] = s
    return sites


def diff(before: dict, after: dict) -> SyncDiff:
    old, new = _sites(before), _sites(after)
    changes = []
    for key in sorted(set(old) | set(new), key=lambda k: tuple(map(str, k))):
        site = new.get(key) or old[key]
        location = f"{os.path.relpath(site['file']) if site.get('file') else '?'}:{site['line']}"
        changes.append(
            SiteChange(
                location=location,
                kind=site["kind"],
                code=site.get("code", ""),
                before=old.get(key, {}).get("count", 0),
                after=new.get(key, {}).get("count", 0),
            )
        )
    changes = [c for c in changes if c.before != c.after]
    return SyncDiff(
        before_total=int(before.get("unintended_syncs", 0)),
        after_total=int(after.get("unintended_syncs", 0)),
        changes=changes,
    )
