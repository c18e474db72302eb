"""`nostall profile` and `nostall trace`: reports and exit codes."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.profiler.test_trace import known_trace

ROOT = Path(__file__).resolve().parents[2]


def nostall(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nostall.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "user_script.py"
    path.write_text(textwrap.dedent(body))
    return path


SYNCING = """
    import sys
    import torch
    import nostall.profiler as profiler

    w = torch.nn.Parameter(torch.ones(3))
    for step in range(int(sys.argv[1])):
        loss = (w * 2).sum()
        if loss > 0:                    # line 9: a sync each step
            pass
        with profiler.allow("logging"):
            loss.item()
        profiler.mark_step()
"""

CLEAN = """
    import torch
    w = torch.nn.Parameter(torch.ones(3))
    loss = (w * 2).sum()
"""


def test_profile_reports_syncs_by_line_and_kind_with_script_args(tmp_path):
    path = script(tmp_path, SYNCING)
    result = nostall("profile", str(path), "--", "4")
    assert result.returncode == 0, result.stderr
    assert "4 unintended sync(s) at 1 site(s), 4 intended over 4 steps" in result.stdout
    assert "user_script.py:9" in result.stdout and "bool" in result.stdout
    assert "item (logging)" in result.stdout


def test_profile_json(tmp_path):
    # The script prints: with --json its output goes to stderr, so stdout stays the report.
    printing = SYNCING + "    print('step done')\n"
    result = nostall("profile", "--json", str(script(tmp_path, printing)), "--", "2")
    data = json.loads(result.stdout)
    assert data["steps"] == 2 and data["unintended_syncs"] == 2 and data["intended_syncs"] == 2
    assert data["unintended"][0]["line"] == 9
    assert "step done" in result.stderr


def test_fail_on_sync_exit_codes(tmp_path):
    assert (
        nostall("profile", "--fail-on-sync", str(script(tmp_path, SYNCING)), "--", "1").returncode
        == 3
    )
    assert nostall("profile", "--fail-on-sync", str(script(tmp_path, CLEAN))).returncode == 0


def test_a_script_that_raises_gets_a_message_and_exit_1(tmp_path):
    path = script(tmp_path, "import torch\nraise ValueError('bad config')\n")
    result = nostall("profile", str(path))
    assert result.returncode == 1
    assert "raised an exception" in result.stderr and "ValueError: bad config" in result.stderr
    assert "nostall/profiler" not in result.stderr and "runpy" not in result.stderr


def test_a_script_exit_code_is_passed_on(tmp_path):
    assert nostall("profile", str(script(tmp_path, "raise SystemExit(4)\n"))).returncode == 4


def test_missing_script_and_bad_usage(tmp_path):
    result = nostall("profile", str(tmp_path / "nope.py"))
    assert result.returncode == 2 and "no such script" in result.stderr
    assert "Traceback" not in result.stderr
    assert nostall("profile").returncode == 2
    assert nostall("frobnicate").returncode == 2


def test_profile_with_trace_on_a_cpu_only_machine(tmp_path):
    trace_path = tmp_path / "trace.json"
    result = nostall(
        "profile", "--trace", str(trace_path), str(script(tmp_path, SYNCING)), "--", "1"
    )
    assert result.returncode == 0, result.stderr
    assert trace_path.is_file()
    assert "device idle breakdown" in result.stdout
    assert "bound by:" in result.stdout and "recorded under the sync watch" in result.stdout
    plot = tmp_path / "bound.png"
    result = nostall(
        "profile",
        "--trace",
        str(trace_path),
        "--plot",
        str(plot),
        str(script(tmp_path, SYNCING)),
        "--",
        "1",
    )
    assert result.returncode == 0 and plot.is_file(), result.stderr
    result = nostall("profile", "--plot", str(plot), str(script(tmp_path, SYNCING)))
    assert result.returncode == 2 and "--plot needs --trace" in result.stderr


def test_trace_command(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(known_trace()))
    result = nostall("trace", str(path))
    assert result.returncode == 0
    assert "host wait" in result.stdout and "train.py:42" in result.stdout
    data = json.loads(nostall("trace", "--json", str(path)).stdout)
    assert data["host_wait_us"] == pytest.approx(100)


@pytest.mark.parametrize("content", [None, "garbage", "{}"])
def test_unreadable_trace_gets_a_message_and_exit_2(tmp_path, content):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    result = nostall("trace", str(path))
    assert result.returncode == 2 and result.stderr.startswith("nostall trace: ")
    assert "Traceback" not in result.stderr


def test_sync_trap_example_runs():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sync_trap.py"), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "== trapped" in result.stdout and "== clean" in result.stdout
