"""A driver killed mid-run (SIGKILL, no clean-up of its own) must leave nothing behind: the
helper the Ray tests share."""

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def ray_processes() -> set[str]:
    """Ray's processes on this machine (by their command lines), as pids."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and (b"ray::" in cmdline or b"/ray/" in cmdline):
            found.add(entry.name)
    return found


def kill_mid_run(
    code: str, leftovers: Callable[[], set[str]] = ray_processes, within_s: float = 20.0
) -> float:
    """Runs `code` (which prints "running" once it is under way) in a fresh interpreter,
    checks it made some `leftovers`, SIGKILLs it, and asserts they are all gone within
    `within_s`; returns how long they took to go."""
    before = leftovers()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "running"
        assert leftovers() - before  # its cluster is up
    finally:
        child.kill()
        child.wait()
    killed = time.monotonic()
    while (left := leftovers() - before) and time.monotonic() < killed + within_s:
        time.sleep(0.5)
    assert not left, left
    return time.monotonic() - killed
