"""A watchdog for processes a run starts through a library that may leave some behind when the
run is killed: a local Ray cluster's agents are children of its raylet, re-parented to init
when the driver is SIGKILLed, and live on. The watchdog is a small process of its own holding
the read end of a pipe; when the driver exits, however it exits, the pipe closes and the
watchdog kills the processes it was told about (each checked by its start time, so a reused
pid is never killed). It is told only of what the run started: the driver's children from
before the run (a user's TensorBoard, DataLoader workers, a notebook's helpers) and theirs are
spared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_WATCHDOG = r"""
import os, signal, sys
sys.stdin.read()  # returns at EOF: the driver closed the pipe or died
for line in sys.argv[1:]:
    pid, start = line.split(":")
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[19] == start:
                os.kill(int(pid), signal.SIGKILL)
    except (OSError, IndexError):
        pass
"""


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[19]


def children(pid: int) -> set[tuple[int, str]]:
    """(pid, start time) of `pid`'s live children: taken before a run starts its processes,
    they are what the run must leave alone."""
    return {(child, start) for child, start in descendants(pid, depth=1)}


def descendants(
    root: int, spare: set[tuple[int, str]] = frozenset(), depth: int | None = None
) -> list[tuple[int, str]]:
    """(pid, start time) of every live descendant of `root` (Linux /proc; [] elsewhere) but
    those in `spare` and theirs; with `depth`, only that many generations down."""
    if not Path("/proc").is_dir():
        return []
    below: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            below.setdefault(stat[0], []).append(int(entry))
            starts[int(entry)] = stat[1]
    found, stack = [], [(root, 0)]
    while stack:
        parent, level = stack.pop()
        if depth is not None and level >= depth:
            continue
        for child in below.get(parent, []):
            if (child, starts[child]) not in spare:
                found.append((child, starts[child]))
                stack.append((child, level + 1))
    return found


class Reaper:
    """Kills `processes` ((pid, start time) pairs) when the driver exits or `close` is called."""

    def __init__(self, processes: list[tuple[int, str]]):
        args = [f"{pid}:{start}" for pid, start in processes]
        self._process = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, *args],
            stdin=subprocess.PIPE,
            start_new_session=True,  # not killed with the driver's process group
        )

    def close(self, timeout_s: float = 10.0) -> None:
        """Closes the pipe: the watchdog kills what is left of the processes, and exits."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        self._process.wait(timeout=timeout_s)
