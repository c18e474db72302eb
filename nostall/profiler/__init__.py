"""nostall.profiler: finds the host-device syncs in a training loop and measures the device
idle time they cause. It depends on no other part of nostall.

- `SyncWatch` records every call that forces (or would force, on a CPU-only machine) a
  host-device sync, with the user's source line, its kind and its count per step.
- `assert_no_sync` fails a test when the code inside syncs unintentionally.
- `analyze_trace` splits a torch.profiler trace's device idle time into host wait, kernel wait
  and other (Holistic Trace Analysis' definitions), and attributes host waits to sync calls.
- `analyze_bound_by` says where a loop's wall time goes (environment step, policy inference,
  update, transfers, waiting) from a torch.profiler trace; `phase` marks a range as one of them.
- `mark_step`, `mark` and `allow` annotate a script for `nostall profile`.
"""

from nostall.profiler.bound import BoundBy, analyze_bound_by, phase
from nostall.profiler.report import SyncEvent, SyncReport, SyncSite
from nostall.profiler.sync import (
    SyncError,
    SyncWatch,
    active_watch,
    allow,
    assert_no_sync,
    mark,
    mark_step,
)
from nostall.profiler.trace import TraceError, analyze_trace

__all__ = [
    "BoundBy",
    "SyncError",
    "SyncEvent",
    "SyncReport",
    "SyncSite",
    "SyncWatch",
    "TraceError",
    "active_watch",
    "allow",
    "analyze_bound_by",
    "analyze_trace",
    "assert_no_sync",
    "mark",
    "mark_step",
    "phase",
]
