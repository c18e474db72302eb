"""Compiles every CUDA source with nvcc against the installed torch's stable-ABI headers.

A CPU torch cannot build the `_C_cuda` extension, but nvcc can still compile each `.cu` file, so
CUDA build errors show up on a machine without a GPU. Exits non-zero if any file fails.
"""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch.utils.cpp_extension as cpp

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("nvcc not found: nothing to check")
        return 1
    includes = [ROOT / "csrc", *cpp.include_paths(), sysconfig.get_paths()["include"]]
    flags = ["-c", "-O3", "-std=c++17", "-DUSE_CUDA", "-DTORCH_TARGET_VERSION=0x020a000000000000"]
    flags += ["-DPy_LIMITED_API=0x03090000", "-arch=sm_80", "-Xcompiler", "-fPIC"]
    sources = sorted(glob.glob(str(ROOT / "csrc" / "**" / "*.cu"), recursive=True))
    with tempfile.TemporaryDirectory() as out:

        def compile_one(index_src):
            index, src = index_src
            cmd = [nvcc, *flags, *(f"-I{p}" for p in includes), src, "-o", f"{out}/{index}.o"]
            return src, subprocess.run(cmd, capture_output=True, text=True)

        # One nvcc per core: each is single-threaded and takes 10-15 s a file.
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            results = list(pool.map(compile_one, enumerate(sources)))
    failed = 0
    for src, result in results:
        status = "ok" if result.returncode == 0 else "FAILED"
        print(f"{status:6} {Path(src).relative_to(ROOT)}")
        if result.returncode != 0:
            print(result.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
