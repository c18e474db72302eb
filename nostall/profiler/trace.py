"""Device idle time from a torch.profiler trace (Chrome JSON), and what the host was doing.

For each CUDA stream: busy time (the union of its kernels, memcpys and memsets) and idle time
(the gaps between them), each gap classified as Holistic Trace Analysis does:
- host wait: the next kernel was launched (its runtime call began) only after the previous one
  had finished, so the device waited for the host;
- kernel wait: otherwise, when the gap is shorter than `consecutive_kernel_delay_us` (launch
  overhead between back-to-back kernels);
- other: the rest (waiting on another stream, an event, ...).
Each host-wait gap is attributed to the synchronising runtime call (cudaStreamSynchronize,
a blocking cudaMemcpy, ...) that the host sat in when the device went idle, with the ATen op
around it and, when the trace was recorded with stacks, the user's source line.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver"}
SYNC_CALLS = {
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
}
# HTA's default threshold for back-to-back kernel launch delay: 30 ns.
DEFAULT_CONSECUTIVE_KERNEL_DELAY_US = 0.03
_PY_FRAME = re.compile(r"^(?P<file>.+\.py)\((?P<line>\d+)\): (?P<func>.*)$")
# Tolerance when matching a sync call's end to the moment the device went idle (trace clocks
# of host and device are aligned to about a microsecond).
_CLOCK_SLACK_US = 2.0


class TraceError(ValueError):
    """The trace file is missing, unreadable, or not a torch.profiler Chrome trace."""


def load_trace(source: str | Path | dict) -> list[dict[str, Any]]:
    if isinstance(source, dict):
        data = source
    else:
        path = Path(source)
        if not path.is_file():
            raise TraceError(f"no trace file at {path}")
        try:
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TraceError(f"cannot read {path} as a Chrome JSON trace: {e}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise TraceError("not a torch.profiler Chrome trace: it has no 'traceEvents' list")
    return [e for e in events if isinstance(e, dict)]


def _span(e: dict) -> tuple[float, float]:
    start = float(e["ts"])
    return start, start + float(e.get("dur", 0.0))


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(spans):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _innermost(events: list[dict], tid: Any, start: float, end: float) -> list[dict]:
    """Events on thread `tid` that enclose [start, end], innermost first."""
    around = [
        e for e in events if e.get("tid") == tid and _span(e)[0] <= start and _span(e)[1] >= end
    ]
    return sorted(around, key=lambda e: float(e.get("dur", 0.0)))


def _user_source(frames: list[dict]) -> str | None:
    for e in frames:  # innermost first
        match = _PY_FRAME.match(str(e.get("name", "")))
        if match and "/torch/" not in match["file"] and "/nostall/profiler/" not in match["file"]:
            return f"{match['file']}:{match['line']}"
    return None


def analyze_trace(
    source: str | Path | dict,
    consecutive_kernel_delay_us: float = DEFAULT_CONSECUTIVE_KERNEL_DELAY_US,
) -> dict[str, Any]:
    """Device busy/idle time per stream, the idle breakdown, and the causes of host waits.

    All times are in microseconds, as in the trace."""
    events = [e for e in load_trace(source) if e.get("ph") == "X" and "ts" in e]
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    runtime = [e for e in events if e.get("cat") in RUNTIME_CATEGORIES]
    launch_ts = {
        e["args"]["correlation"]: float(e["ts"])
        for e in runtime
        if isinstance(e.get("args"), dict) and "correlation" in e["args"]
    }
    syncs = [e for e in runtime if any(call in str(e.get("name", "")) for call in SYNC_CALLS)]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    py_frames = [e for e in events if e.get("cat") == "python_function"]

    by_stream: dict[tuple, list[dict]] = defaultdict(list)
    for e in device:
        args = e.get("args") or {}
        by_stream[(args.get("device", e.get("pid")), args.get("stream", e.get("tid")))].append(e)

    streams, host_waits = [], []
    for (dev, stream), kernels in sorted(by_stream.items(), key=lambda kv: str(kv[0])):
        kernels.sort(key=lambda e: float(e["ts"]))
        totals = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
        prev_end = None
        for k in kernels:
            start, end = _span(k)
            if prev_end is not None and start > prev_end:
                gap = start - prev_end
                launched = launch_ts.get((k.get("args") or {}).get("correlation"))
                if launched is not None and launched > prev_end:
                    totals["host_wait"] += gap
                    host_waits.append(
                        _attribute(prev_end, start, launched, syncs, cpu_ops, py_frames)
                    )
                elif gap < consecutive_kernel_delay_us:
                    totals["kernel_wait"] += gap
                else:
                    totals["other"] += gap
            prev_end = end if prev_end is None else max(prev_end, end)
        busy = _union_length([_span(k) for k in kernels])
        streams.append(
            {
                "device": dev,
                "stream": stream,
                "busy_us": busy,
                "idle_us": sum(totals.values()),
                "host_wait_us": totals["host_wait"],
                "kernel_wait_us": totals["kernel_wait"],
                "other_us": totals["other"],
            }
        )

    spans = [_span(e) for e in device]
    window = (max(end for _, end in spans) - min(s for s, _ in spans)) if spans else 0.0
    busy = _union_length(spans)
    host_waits.sort(key=lambda g: -g["idle_us"])
    return {
        "window_us": window,
        "busy_us": busy,
        "idle_us": window - busy,
        "host_wait_us": sum(s["host_wait_us"] for s in streams),
        "kernel_wait_us": sum(s["kernel_wait_us"] for s in streams),
        "other_us": sum(s["other_us"] for s in streams),
        "streams": streams,
        "host_wait_causes": host_waits,
    }


def _attribute(
    idle_from: float,
    idle_to: float,
    launched: float,
    syncs: list[dict],
    cpu_ops: list[dict],
    py_frames: list[dict],
) -> dict[str, Any]:
    """The sync call the host sat in when the device went idle at `idle_from`, if any."""
    candidates = [
        e
        for e in syncs
        if _span(e)[0] <= idle_from + _CLOCK_SLACK_US
        and _span(e)[1] >= idle_from - _CLOCK_SLACK_US
        and _span(e)[1] <= launched + _CLOCK_SLACK_US
    ]
    gap = {"start_us": idle_from, "idle_us": idle_to - idle_from, "sync_call": None}
    gap.update({"op": None, "source": None})
    if not candidates:
        gap["sync_call"] = "no sync call (host busy)"
        return gap
    sync = max(candidates, key=lambda e: _span(e)[1])
    start, end = _span(sync)
    ops = _innermost(cpu_ops, sync.get("tid"), start, end)
    gap["sync_call"] = str(sync.get("name"))
    gap["op"] = str(ops[0]["name"]) if ops else None
    gap["source"] = _user_source(_innermost(py_frames, sync.get("tid"), start, end))
    return gap
