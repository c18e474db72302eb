"""Every sync kind has a fix: a one-line hint on each report row, and a before/after pair in
docs/sync_points.md that is run here (the first block must sync with its kind, the second must
not sync at all)."""

import linecache
import os
import re

import pytest
import torch

from nostall.profiler import SyncWatch, allow
from nostall.profiler.catalog import HINTS

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "sync_points.md")
BLOCK = re.compile(r"```python fix-(before|after) ([^\n]+)\n(.*?)```", re.S)


def _pairs() -> dict[str, dict[str, str]]:
    with open(DOCS) as f:
        text = f.read()
    pairs: dict[str, dict[str, str]] = {}
    for which, kind, code in BLOCK.findall(text):
        assert which not in pairs.setdefault(kind, {}), f"two {which} blocks for {kind!r}"
        pairs[kind][which] = code
    return pairs


PAIRS = _pairs()


def _namespace() -> dict:
    w = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 8))
    g = torch.Generator().manual_seed(0)
    m = torch.randn(4, 4, generator=g)
    return {
        "torch": torch,
        "allow": allow,
        "d": w * 1.0,
        "loss": (w * w).sum(),
        "k": (w > 0).sum(),
        "logits": (w * 1.0).reshape(2, 4),
        "A": m @ m.T + torch.eye(4),
        "table": [float(i) for i in range(8)],
        "table_t": torch.arange(8.0),
        "total": 0.0,
        "total_t": torch.zeros(()),
        "running": 0.0,
        "running_t": torch.zeros(()),
        "history": [],
        "host_actions": torch.zeros(2, dtype=torch.long),
        "step": 100,
        "device": torch.device("cpu"),  # the script's compute device, on this CPU-only machine
        "staging": torch.zeros(8),  # a pinned host buffer, on a GPU
    }


def _run(code: str, name: str):
    namespace = _namespace()
    device = [namespace[k] for k in ("d", "loss", "k", "logits", "A")]
    filename = f"<{name}>"
    # Its source, for the watch that reads how a move names its target (`.to(device)`).
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    with SyncWatch(tensors=tuple(device)) as watch:
        exec(compile(code, filename, "exec"), namespace)
    return watch


def test_every_kind_has_a_hint_and_a_documented_fix():
    assert set(PAIRS) == set(HINTS), set(PAIRS) ^ set(HINTS)
    for kind, pair in PAIRS.items():
        assert set(pair) == {"before", "after"}, kind
        assert HINTS[kind], kind


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_the_before_block_syncs_and_the_after_block_does_not(kind, capsys):
    before = _run(PAIRS[kind]["before"], f"before {kind}")
    kinds = {e.kind for e in before.events if not e.allowed}
    assert kinds == {kind}, kinds
    after = _run(PAIRS[kind]["after"], f"after {kind}")
    assert [e.kind for e in after.events if not e.allowed] == []


def test_report_rows_carry_the_hint():
    watch = _run("x = d.sum().item()\ny = d[d > 0]", "hints")
    report = watch.report()
    assert {s.kind: s.hint for s in report.unintended} == {
        "item": HINTS["item"],
        "boolean mask indexing": HINTS["boolean mask indexing"],
    }
    table = report.table()
    assert f"fix: {HINTS['item']}" in table
    assert all(row["hint"] for row in report.to_dict()["unintended"])
