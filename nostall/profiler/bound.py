"""What a training loop is bound by: where its wall time goes, from a torch.profiler trace.

Every microsecond of the profiled host thread's wall time goes to one category, the most
specific that covers it:
- waiting: the host blocked on the device (cudaStreamSynchronize, cudaDeviceSynchronize, event
  waits, a blocking cudaMemcpy) or in a range the user marked `phase("wait")` (a queue);
- host-device transfer: cudaMemcpy* calls and copy ops between host and device;
- a range the user marked with `phase(name)` (one of PHASES);
- environment step: an environment's `step` (Gymnasium's and EnvPool's Python frames, seen when
  the trace was recorded with `with_stack=True`, and nostall's native env ops);
- update: the optimizer's step and zero_grad, the backward pass (the autograd engine's
  functions), and the forward ops whose outputs were backpropagated (the trace's forward-backward
  links);
- policy inference: every other torch op (forward passes not backpropagated);
- other (Python): time covered by none of these (the interpreter between ops, data handling).

`nostall trace TRACE.json` prints the table (`--plot PATH` draws it); for nostall's own
trainers the report's timeline gives the same split between the rollout and training sides.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# In reporting order; each names the category a phase() range counts as.
PHASES = {
    "env": "environment step",
    "inference": "policy inference",
    "update": "update",
    "transfer": "host-device transfer",
    "wait": "waiting",
}
OTHER = "other (Python)"
CATEGORIES = (
    "environment step",
    "policy inference",
    "update",
    "host-device transfer",
    "waiting",
    OTHER,
)
_PHASE_PREFIX = "nostall.phase:"
_WAIT_CALLS = re.compile(
    r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cuCtxSynchronize|"
    r"cuStreamSynchronize|cuEventSynchronize|cudaStreamWaitEvent)$"
)
_TRANSFER_CALLS = re.compile(r"^(cudaMemcpy|cuMemcpy)")
_ENV_FRAME = re.compile(
    r"(gymnasium|envpool|nostall/envs|stable_baselines3/common/vec_env)/"
    r".*\): (step|step_wait|recv)$"
)
_ENV_OPS = re.compile(r"^nostall::env_(step|step_into|rollout|send)")
_UPDATE_RANGES = re.compile(r"^(Optimizer\.(step|zero_grad)#|autograd::engine::evaluate_function)")
# Priority when ranges nest: the first listed wins.
_PRIORITY = (
    "waiting",
    "host-device transfer",
    "user",
    "environment step",
    "update",
    "policy inference",
)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Marks a range of the loop as one of PHASES ("env", "inference", "update", "transfer",
    "wait") in a torch.profiler trace, for the bound-by table. Free when no profiler runs."""
    if name not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {name!r}")
    with torch.profiler.record_function(_PHASE_PREFIX + name):
        yield


@dataclass
class BoundBy:
    """Wall time per category, in microseconds, over `wall_us` of the profiled thread."""

    wall_us: float
    by_category: dict[str, float]
    steps: int | None  # profiler steps in the trace (ProfilerStep# ranges), if any
    note: str | None = None  # a caveat printed under the table

    @property
    def bound_by(self) -> str:
        return max(self.by_category, key=self.by_category.get)

    def table(self) -> str:
        per_step = self.steps and self.steps > 0
        lines = [
            f"bound by: {self.bound_by} "
            f"({100 * self.by_category[self.bound_by] / self.wall_us:.0f}% of "
            f"{self.wall_us / 1e3:.1f} ms)",
            f"  {'where the time goes':24} {'ms':>9} {'share':>7}"
            + (f" {'ms/step':>9}" if per_step else ""),
        ]
        for category in CATEGORIES:
            us = self.by_category[category]
            row = f"  {category:24} {us / 1e3:9.2f} {100 * us / self.wall_us:6.1f}%"
            if per_step:
                row += f" {us / 1e3 / self.steps:9.3f}"
            lines.append(row)
        if self.note:
            lines.append(f"  ({self.note})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_ms": self.wall_us / 1e3,
            "steps": self.steps,
            "bound_by": self.bound_by,
            "ms": {c: us / 1e3 for c, us in self.by_category.items()},
            "note": self.note,
        }

    def plot(self, path: str | Path) -> Path:
        """One horizontal bar, split by category, saved as a PNG."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        fig, ax = plt.subplots(figsize=(8, 1.9))
        left = 0.0
        for category in CATEGORIES:
            ms = self.by_category[category] / 1e3
            ax.barh([0], [ms], left=left, label=f"{category} {ms:.1f} ms")
            left += ms
        ax.set_yticks([])
        ax.set_xlabel("wall time of the profiled thread (ms)")
        ax.set_title(f"bound by: {self.bound_by}")
        ax.legend(
            loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=3, fontsize=7, frameon=False
        )
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        return path


def _category(event: dict[str, Any], backpropagated: set[tuple[float, Any]]) -> str | None:
    name, cat = event.get("name", ""), event.get("cat")
    if name.startswith("ProfilerStep#"):
        return None  # the step itself, not a kind of work
    if cat in ("cuda_runtime", "cuda_driver"):
        if _WAIT_CALLS.match(name):
            return "waiting"
        if _TRANSFER_CALLS.match(name):
            return "host-device transfer"
        return None
    if cat == "user_annotation" or (cat == "cpu_op" and name.startswith(_PHASE_PREFIX)):
        if name.startswith(_PHASE_PREFIX):
            return "user:" + PHASES.get(name[len(_PHASE_PREFIX) :], OTHER)
        if _UPDATE_RANGES.match(name):
            return "update"
        return None
    if cat == "python_function":
        return "environment step" if _ENV_FRAME.search(name) else None
    if cat == "cpu_op":
        if _ENV_OPS.match(name):
            return "environment step"
        if _UPDATE_RANGES.match(name) or (event["ts"], event.get("tid")) in backpropagated:
            return "update"
        if name in ("aten::_to_copy", "aten::copy_") and _crosses_devices(event):
            return "host-device transfer"
        return "policy inference"
    return None


def _crosses_devices(event: dict[str, Any]) -> bool:
    """A copy op whose recorded input types include a CUDA and a CPU tensor (shapes recorded)."""
    types = " ".join(str(t) for t in event.get("args", {}).get("Input type", []))
    return "cuda" in types.lower() and "cpu" in types.lower()


def analyze_bound_by(source) -> BoundBy:
    """The bound-by split of a torch.profiler Chrome trace (a path or the loaded dict), over the
    thread that ran the most host time (the training loop's)."""
    from nostall.profiler.trace import TraceError, load_trace

    loaded = load_trace(source)
    events = [e for e in loaded if e.get("ph") == "X" and "dur" in e]
    host = [
        e
        for e in events
        if e.get("cat")
        in ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
    ]
    if not host:
        raise TraceError("the trace has no host events (record it with ProfilerActivity.CPU)")
    busy: dict[Any, float] = {}
    for e in host:
        if e.get("cat") == "cpu_op":
            busy[e.get("tid")] = busy.get(e.get("tid"), 0.0) + float(e["dur"])
    tid = max(busy, key=busy.get) if busy else host[0].get("tid")
    thread = [e for e in host if e.get("tid") == tid]
    backpropagated = {
        (e["ts"], e.get("tid")) for e in loaded if e.get("cat") == "fwdbwd" and e.get("ph") == "s"
    }
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    if steps:
        start = min(float(e["ts"]) for e in steps)
        end = max(float(e["ts"]) + float(e["dur"]) for e in steps)
    else:
        start = min(float(e["ts"]) for e in thread)
        end = max(float(e["ts"]) + float(e["dur"]) for e in thread)
    # Sweep: at each boundary, the categories covering the segment that follows.
    bounds: list[tuple[float, int, str]] = []
    for e in thread:
        category = _category(e, backpropagated)
        if category is None:
            continue
        s, f = max(float(e["ts"]), start), min(float(e["ts"]) + float(e["dur"]), end)
        if f > s:
            bounds.append((s, 1, category))
            bounds.append((f, -1, category))
    bounds.sort(key=lambda b: (b[0], b[1]))
    active: dict[str, int] = {}
    totals = dict.fromkeys(CATEGORIES, 0.0)
    previous = start
    for time, change, category in bounds:
        if time > previous:
            totals[_winner(active)] += time - previous
            previous = time
        active[category] = active.get(category, 0) + change
    totals[OTHER] += max(0.0, end - previous)
    return BoundBy(wall_us=end - start, by_category=totals, steps=len(steps) or None)


def _winner(active: dict[str, int]) -> str:
    live = [c for c, n in active.items() if n > 0]
    if not live:
        return OTHER
    for kind in _PRIORITY:
        if kind == "user":
            users = [c for c in live if c.startswith("user:")]
            if users:
                return users[-1][len("user:") :]
        elif kind in live:
            return kind
    return OTHER
