"""Runs a user's script under SyncWatch (and, optionally, torch.profiler) for `nostall profile`."""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from nostall.profiler.bound import analyze_bound_by
from nostall.profiler.report import SyncReport
from nostall.profiler.sync import SyncWatch
from nostall.profiler.trace import analyze_trace

_RUNPY_FILE = runpy.__file__
_PROFILER_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass
class ScriptRun:
    report: SyncReport
    exit_code: int  # the script's own: 0, its SystemExit code, or 1 if it raised
    error: str | None  # the script's traceback (its own frames only), if it raised


def _script_traceback(exc: BaseException) -> str:
    """The traceback of an exception the script raised, without our or runpy's frames."""
    tb = traceback.TracebackException.from_exception(exc)
    ours = (_RUNPY_FILE, "<frozen runpy>")
    tb.stack = traceback.StackSummary.from_list(
        [f for f in tb.stack if f.filename not in ours and not f.filename.startswith(_PROFILER_DIR)]
    )
    return "".join(tb.format())


@contextlib.contextmanager
def _as_main(script: Path, args: list[str]):
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent.resolve()))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def run_script(
    script: str | os.PathLike,
    args: list[str],
    *,
    all_tensors: bool = False,
    trace_path: str | os.PathLike | None = None,
    only_user_code: bool = False,
) -> ScriptRun:
    """Runs `script` as __main__ with `args`; FileNotFoundError if there is no such file."""
    path = Path(script)
    if not path.is_file():
        raise FileNotFoundError(f"no such script: {path}")
    watch = SyncWatch(all_tensors=all_tensors)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    recorder = (
        torch.profiler.profile(activities=activities, with_stack=True)
        if trace_path is not None
        else contextlib.nullcontext()
    )
    exit_code, error = 0, None
    with _as_main(path, args), recorder as prof:
        try:
            with watch:
                runpy.run_path(str(path), run_name="__main__")
        except SystemExit as e:
            exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception as e:
            exit_code, error = 1, _script_traceback(e)
    report = watch.report(only_user_code)
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
        report.idle = analyze_trace(trace_path)
        report.bound = analyze_bound_by(trace_path)
        report.bound.note = (
            "recorded under the sync watch, which adds Python work to every torch op: the "
            "shares of inference and update are inflated; record a trace without it and run "
            "`nostall trace` for clean figures"
        )
    return ScriptRun(report, exit_code, error)
