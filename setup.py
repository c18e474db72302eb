"""Builds nostall's native op libraries.

`nostall._C` holds every schema and the CPU kernels; it uses the stable ABI and has no CUDA
dependency. `nostall._C_autograd` holds the autograd kernels, which need the regular ABI.
`nostall._C_cuda` holds the CUDA kernels and is built only when the installed torch has CUDA and a
CUDA toolkit (nvcc) is found (nostall/_build_plan.py): a stock machine's CUDA torch without the
toolkit builds the CPU libraries and says why. Build without isolation, against
the torch already installed: `pip install --no-build-isolation -e .` (an isolated build would
pull a CUDA torch).
"""

import glob
import importlib.util
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# The stable ABI: one binary loads under every torch from 2.10 on, and headers compile in ~1 s.
# (torch adds -DPy_LIMITED_API itself for py_limited_api extensions.)
STABLE_ABI_FLAGS = ["-DTORCH_TARGET_VERSION=0x020a000000000000"]
# -ffp-contract=off: no fused multiply-add, so environment dynamics round as NumPy does.
# -fno-trapping-math: no kernel reads the FP exception flags, and without it GCC will not
# vectorize loops with float comparisons (a clamp, a max). Values are unchanged by it.
# -fno-math-errno: no kernel reads errno, and without it a square root in a loop is a libm call
# guarded for a negative argument, so the loop stays scalar (the Adam step's). Values are
# unchanged by it.
# -Wno-psabi: GCC's notes that passing 32-byte vectors by value differs from GCC 4.6's ABI and
# without AVX enabled: the vector helpers are inline functions inside one library built by one
# compiler, so no such value crosses an ABI boundary.
CXX_FLAGS = [
    "-O3",
    "-Wno-psabi",
    "-g0",
    "-std=c++17",
    "-ffp-contract=off",
    "-fno-trapping-math",
    "-fno-math-errno",
    *STABLE_ABI_FLAGS,
]


def _build_plan():
    """nostall/_build_plan.py, by its path (the package cannot be imported before it is built)."""
    spec = importlib.util.spec_from_file_location("_build_plan", "nostall/_build_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_skip_reason() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    return _build_plan().cuda_skip_reason(torch.__version__, torch.version.cuda, CUDA_HOME,
                                          dict(os.environ))  # fmt: skip


CUDA_SKIPPED = cuda_skip_reason()
if CUDA_SKIPPED and torch.version.cuda:
    print(f"nostall: building the CPU kernels only: {CUDA_SKIPPED}")


def cpu_sources() -> list[str]:
    # csrc/autograd/ uses the regular ABI and builds into a library of its own.
    return sorted(p for p in glob.glob("csrc/**/*.cpp", recursive=True) if "autograd" not in p)


def cuda_sources() -> list[str]:
    return sorted(glob.glob("csrc/**/*.cu", recursive=True))


# Compiled for when no GPU is visible (a Docker build, a CPU build host) and TORCH_CUDA_ARCH_LIST
# is unset: Ampere, Hopper and Blackwell machine code (8.0 runs on 8.6 and 8.9 too), and PTX of
# the newest for GPUs after it. With a GPU visible, torch targets that GPU.
DEFAULT_CUDA_ARCHS = "8.0;9.0;10.0;12.0+PTX"


def set_default_cuda_archs() -> None:
    if os.environ.get("TORCH_CUDA_ARCH_LIST") or torch.cuda.is_available():
        return
    os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_CUDA_ARCHS
    print(f"nostall: no GPU visible and TORCH_CUDA_ARCH_LIST unset: building the CUDA kernels "
          f"for {DEFAULT_CUDA_ARCHS}")  # fmt: skip


def cudart_dirs() -> list[str]:
    """Where libcudart.so may be besides CUDA_HOME/lib64 (which torch adds itself): lib/ or
    targets/<arch>/lib/ of the toolkit. CUDA_HOME is where torch found nvcc, which need not be
    the toolkit's root (an nvcc in /usr/local/bin gives /usr/local), so /usr/local/cuda is
    searched too."""
    from torch.utils.cpp_extension import CUDA_HOME

    roots = [r for r in (CUDA_HOME, os.environ.get("CUDA_PATH"), "/usr/local/cuda") if r]
    found: list[str] = []
    for root in roots:
        for d in [os.path.join(root, "lib"), os.path.join(root, "lib64"),
                  *sorted(glob.glob(os.path.join(root, "targets", "*", "lib")))]:  # fmt: skip
            if os.path.exists(os.path.join(d, "libcudart.so")) and d not in found:
                found.append(d)
    return found


def extensions() -> list:
    exts = [
        CppExtension(
            "nostall._C",
            cpu_sources(),
            include_dirs=[os.path.abspath("csrc")],
            extra_compile_args={"cxx": CXX_FLAGS},
            py_limited_api=True,
        ),
        # Autograd kernels need the regular (version-bound) ABI: the stable ABI has no autograd.
        CppExtension(
            "nostall._C_autograd",
            sorted(glob.glob("csrc/autograd/*.cpp")),
            include_dirs=[os.path.abspath("csrc")],
            extra_compile_args={"cxx": ["-O2", "-g0", "-std=c++20"]},
        ),
    ]
    if CUDA_SKIPPED is None:
        from torch.utils.cpp_extension import CUDAExtension

        set_default_cuda_archs()
        exts.append(
            CUDAExtension(
                "nostall._C_cuda",
                cuda_sources(),
                include_dirs=[os.path.abspath("csrc")],
                library_dirs=cudart_dirs(),
                extra_compile_args={
                    "cxx": [*CXX_FLAGS, "-DUSE_CUDA"],
                    "nvcc": ["-O3", "-std=c++17", "-DUSE_CUDA", *STABLE_ABI_FLAGS],
                },
                py_limited_api=True,
            )
        )
    return exts


def write_build_info() -> None:
    """Records the torch the native library is built against, for a clear error at import
    when a different torch is installed."""
    with open(os.path.join("nostall", "_build_info.py"), "w") as f:
        f.write('"""Written by setup.py at build time."""\n\n')
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"CUDA_KERNELS = {CUDA_SKIPPED is None}\n")
        f.write(f"CUDA_SKIPPED = {CUDA_SKIPPED!r}  # why the CUDA kernels were not built\n")


write_build_info()

# The wheel is tagged for the Python it was built with (cp311-cp311, say), not abi3: _C is
# limited-API, but _C_autograd is built against this Python's full API.
# NOSTALL_NO_EXTENSIONS=1: the package without its native libraries. `make` installs the
# editable package so, then builds the libraries once, in place (`setup.py build_ext
# --inplace`): an editable install would otherwise build them out of tree first, then `make`
# again in place, for twice the time.
NO_EXTENSIONS = os.environ.get("NOSTALL_NO_EXTENSIONS") == "1"
setup(ext_modules=[] if NO_EXTENSIONS else extensions(), cmdclass={"build_ext": BuildExtension})
