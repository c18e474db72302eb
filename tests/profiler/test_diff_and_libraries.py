"""`nostall profile --diff` (what a change added or removed) and syncs inside installed
libraries (reported with the user's calling line; `--only-user-code` folds them into it)."""

import json
import re
import textwrap

import torch

from nostall.profiler import SyncWatch
from tests.profiler.test_cli import SYNCING, nostall, script

FIXED = """
    # The same loop with its sync fixed; these comment lines move every line below by two.
    #
    import sys
    import torch
    import nostall.profiler as profiler

    w = torch.nn.Parameter(torch.ones(3))
    for step in range(int(sys.argv[1])):
        loss = (w * 2).sum()
        y = torch.where(loss > 0, loss, -loss)
        with profiler.allow("logging"):
            loss.item()
        profiler.mark_step()
"""


def _report(tmp_path, name, body):
    """The report of `body` run as tmp_path/user_script.py (one path: before and after a change
    to the same file), saved as tmp_path/name.json."""
    path = script(tmp_path, body)
    result = nostall("profile", "--json", str(path), "--", "3")
    assert result.returncode == 0, result.stderr
    out = tmp_path / f"{name}.json"
    out.write_text(result.stdout)
    return out


def test_diff_shows_a_removed_sync_and_fails_on_an_added_one(tmp_path):
    before = _report(tmp_path, "before", SYNCING)
    after = _report(tmp_path, "after", FIXED)
    fixed = nostall("profile", "--diff", str(before), str(after))
    assert fixed.returncode == 0, fixed.stderr
    assert "3 -> 0 unintended syncs, 0 site(s) added, 1 removed" in fixed.stdout
    assert "- " in fixed.stdout and "bool" in fixed.stdout and "if loss > 0:" in fixed.stdout
    regressed = nostall("profile", "--diff", str(after), str(before), "--json")
    assert regressed.returncode == 3
    changes = json.loads(regressed.stdout)["changes"]
    assert [(c["kind"], c["before"], c["after"]) for c in changes] == [("bool", 0, 3)]


def test_diff_matches_sites_by_their_text_not_their_line_number(tmp_path):
    before = _report(tmp_path, "before", SYNCING)
    moved = SYNCING.replace("import sys", "# a comment\n    import sys")
    after = _report(tmp_path, "after", moved)
    result = nostall("profile", "--diff", str(before), str(after))
    assert result.returncode == 0
    assert "0 site(s) added, 0 removed" in result.stdout


def test_diff_bad_input_is_a_usage_error(tmp_path):
    not_a_report = tmp_path / "x.json"
    not_a_report.write_text('{"steps": 1}')
    for args, message in [
        (("--diff", str(tmp_path / "missing.json"), str(not_a_report)), "cannot read"),
        (("--diff", str(not_a_report), str(not_a_report)), "not a `nostall profile --json`"),
        (("script.py", "--diff", str(not_a_report), str(not_a_report)), "give no SCRIPT"),
        ((), "a SCRIPT to run, or --diff"),
    ]:
        result = nostall("profile", *args)
        assert result.returncode == 2, (args, result.stdout)
        assert message in result.stderr, (args, result.stderr)


LIBRARY = """
    def total(t):
        return t.sum().item()       # line 3: the sync, inside the library
"""
USER = """
    import sys
    sys.path.insert(0, sys.argv[1])
    import fakelib
    import torch

    w = torch.nn.Parameter(torch.ones(3))
    fakelib.total(w * 2)            # line 8: the user's call
    fakelib.total(w * 3)            # line 9: another
"""


def test_a_library_sync_names_the_user_line_that_called_it(tmp_path):
    library = tmp_path / "site-packages"
    library.mkdir()
    (library / "fakelib.py").write_text(textwrap.dedent(LIBRARY))
    path = script(tmp_path, USER)
    result = nostall("profile", "--json", str(path), "--", str(library))
    assert result.returncode == 0, result.stderr
    sites = json.loads(result.stdout)["unintended"]
    assert sorted((s["line"], s["library"], s["called_from"].split(":")[-1]) for s in sites) == [
        (3, True, "8"),
        (3, True, "9"),
    ]
    table = nostall("profile", str(path), "--", str(library)).stdout
    assert "in installed libraries" in table
    assert re.search(r"called from \S*user_script.py:8", table), table
    folded = nostall("profile", "--json", "--only-user-code", str(path), "--", str(library))
    sites = json.loads(folded.stdout)["unintended"]
    assert sorted((s["file"].endswith("user_script.py"), s["line"]) for s in sites) == [
        (True, 8),
        (True, 9),
    ]


def test_cpu_numpy_is_one_sync_and_the_source_stays_on_the_device():
    w = torch.nn.Parameter(torch.ones(3))
    with SyncWatch(tensors=(w,)) as watch:
        d = w.detach() * 2
        host = d.cpu()
        host.numpy()  # the copy: no second sync
        host.sum().item()
        d.sum().item()  # the source is still a device tensor
    assert [e.kind for e in watch.events] == ["copy to host", "item"]
