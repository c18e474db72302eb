"""Where a call comes from, for SyncWatch: the user's frame a sync is reported at (and the
nearest user line below an installed library's), whether torch's own code made the call, and
whether a move names the host in its source."""

from __future__ import annotations

import itertools
import linecache
import sys
from dataclasses import dataclass

import torch

from nostall.profiler import catalog


@dataclass
class Source:
    file: str
    line: int
    function: str
    in_distributions: bool
    caller: tuple[str, int] | None = None  # the nearest user line, when file is a library's


def outside_torch(filename: str) -> bool:
    return not filename.startswith(catalog.INTERNAL_DIRS) and not filename.startswith("<frozen")


def user_frame() -> Source:
    """The first frame outside torch and the profiler (where the sync is reported) and, when
    that frame is an installed library's, the nearest frame of the user's own code below it."""
    frame = sys._getframe(1)
    in_distributions = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(catalog.DISTRIBUTIONS_DIR) and (
            frame.f_code.co_name in catalog.VALIDATION_FUNCTIONS
        ):
            # Argument validation (a support check read on the host), not the distribution's
            # own work: Categorical.sample's multinomial keeps its kind.
            in_distributions = True
        if outside_torch(filename):
            source = Source(filename, frame.f_lineno, frame.f_code.co_name, in_distributions)
            if catalog.is_library(filename):
                caller = frame.f_back
                while caller is not None and not (
                    outside_torch(caller.f_code.co_filename)
                    and not catalog.is_library(caller.f_code.co_filename)
                ):
                    caller = caller.f_back
                if caller is not None:
                    source.caller = (caller.f_code.co_filename, caller.f_lineno)
            return source
        frame = frame.f_back
    return Source("<unknown>", 0, "<unknown>", in_distributions)


def called_from_torch() -> bool:
    """True when the tensor call was made by torch's own code. `t.to(device)` there is
    device-generic plumbing (moving a module, clip_grad_norm_'s scale factor): on a GPU it
    targets the GPU, and on a CPU-only machine it cannot be told from a copy to the host."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(catalog.PROFILER_DIR):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(catalog.TORCH_DIR)


def names_host(target: torch.device) -> bool:
    """Whether a move or factory targets the host. A CUDA target is the device; a CPU target is
    the host on a machine with CUDA, and on a machine without it the host only when the call
    names the CPU in its source (`.to("cpu")`): there `device = "cuda" if available else "cpu"`
    is the script's compute device, a would-be GPU."""
    if target.type != "cpu":
        return False
    if torch.cuda.is_available():
        return True
    # The line that made the call (torch's own, for a call inside torch: Adam's step counter is
    # created with device="cpu"), not the user's line the sync would be reported at.
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(catalog.PROFILER_DIR):
        frame = frame.f_back
    if frame is None:
        return True
    line = call_text(frame)
    # Code without a source file (a string run with exec) says nothing: the CPU is the host.
    return not line or bool(catalog.NAMES_CPU.search(line))


def call_text(frame) -> str:
    """The source of the call a frame is executing, across lines (from the code object's
    positions; its line alone where positions are missing)."""
    filename = frame.f_code.co_filename
    # The instruction's position, without listing every position of the code object.
    position = next(itertools.islice(frame.f_code.co_positions(), frame.f_lasti // 2, None), None)
    start, end = (position[0], position[1]) if position is not None else (None, None)
    if start is None:
        return linecache.getline(filename, frame.f_lineno)
    return "".join(linecache.getline(filename, n) for n in range(start, (end or start) + 1))
