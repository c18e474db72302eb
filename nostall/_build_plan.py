"""Which native libraries a build makes, decided before compiling anything (setup.py loads
this file by its path: the package itself cannot be imported before its libraries exist).

The CUDA kernels need a CUDA torch and a CUDA toolkit (nvcc). A stock Linux machine's
`pip install torch` is the CUDA build, usually without the toolkit: there the build makes the CPU
libraries, says why it skipped the CUDA ones and how to get them, and the skip is recorded so
that a CUDA tensor reaching an op later is refused with the same reason (nostall/_native.py)."""

from __future__ import annotations

import os
import shutil


def cuda_skip_reason(
    torch_version: str, torch_cuda: str | None, cuda_home: str | None, environ: dict
) -> str | None:
    """None when the CUDA kernels are to be built; else why not, with what to do."""
    if environ.get("NOSTALL_NO_CUDA") == "1":
        return "built with NOSTALL_NO_CUDA=1"
    if not torch_cuda:
        return f"torch {torch_version} is a CPU build"
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else None
    if nvcc is None or not (os.path.exists(nvcc) or shutil.which("nvcc")):
        return (
            f"torch {torch_version} is built for CUDA {torch_cuda}, but no CUDA toolkit "
            f"(nvcc) was found when nostall was built; install the toolkit for CUDA "
            f"{torch_cuda} (or set CUDA_HOME to it) and rebuild (`make build`, or "
            f"`pip install --no-build-isolation -e .`), or run on the CPU"
        )
    return None
