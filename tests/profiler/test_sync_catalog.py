"""SyncWatch against the snippet catalog: every sync found, with its kind; no false alarm."""

import linecache

import pytest
import torch

from nostall.profiler import SyncWatch
from tests.profiler.sync_snippets import CLEAN, SYNCING, snippet_namespace


def run_snippet(code: str, name: str):
    w = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 8))
    namespace = snippet_namespace(w)
    filename = f"<snippet {name}>"
    # Its source, for the watch that reads how a move names its target (`.to(device)`).
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    compiled = compile(code, filename, "exec")
    # d and A were computed before the watch began: marked as device tensors explicitly.
    with SyncWatch(tensors=(namespace["d"], namespace["A"])) as watch:
        exec(compiled, namespace)
    return [e for e in watch.events if not e.allowed]


@pytest.mark.parametrize("name,code,count,kind", SYNCING, ids=[s[0] for s in SYNCING])
def test_syncing_snippet_is_caught(name, code, count, kind):
    events = run_snippet(code, name)
    assert len(events) == count, [e.kind for e in events]
    if kind is not None:
        assert {e.kind for e in events} == {kind}
    assert all(e.file == f"<snippet {name}>" for e in events)


@pytest.mark.parametrize("name,code", CLEAN, ids=[s[0] for s in CLEAN])
def test_clean_look_alike_is_not_flagged(name, code):
    assert run_snippet(code, name) == []


def test_catalog_precision_and_recall(capsys):
    assert len(SYNCING) + len(CLEAN) >= 40
    true_pos = false_pos = false_neg = 0
    for name, code, count, _ in SYNCING:
        found = len(run_snippet(code, name))
        true_pos += min(found, count)
        false_pos += max(0, found - count)
        false_neg += max(0, count - found)
    for name, code in CLEAN:
        false_pos += len(run_snippet(code, name))
    precision = true_pos / max(1, true_pos + false_pos)
    recall = true_pos / max(1, true_pos + false_neg)
    with capsys.disabled():
        print(
            f"\nsync catalog: {len(SYNCING)} syncing + {len(CLEAN)} clean snippets, "
            f"precision {precision:.3f}, recall {recall:.3f}"
        )
    assert precision == 1.0 and recall == 1.0
