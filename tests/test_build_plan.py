"""A CUDA torch without the CUDA toolkit (a stock Linux machine's `pip install torch`): the build
makes the CPU libraries and says why not the CUDA ones, and a CUDA tensor reaching an op later is
refused with that reason, not the dispatcher's bare "could not run"."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _plan():
    spec = importlib.util.spec_from_file_location("_build_plan", ROOT / "nostall/_build_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cuda_kernels_are_built_only_with_a_cuda_torch_and_a_toolkit(tmp_path, monkeypatch):
    reason = _plan().cuda_skip_reason
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvcc on the PATH either
    assert "is a CPU build" in reason("2.13.0+cpu", None, None, {})
    missing = reason("2.13.0", "13.0", None, {})
    assert "built for CUDA 13.0, but no CUDA toolkit (nvcc) was found" in missing
    assert "rebuild" in missing and "run on the CPU" in missing
    toolkit = tmp_path / "cuda"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin/nvcc").write_text("")
    assert reason("2.13.0", "13.0", str(toolkit), {}) is None
    assert reason("2.13.0", "13.0", str(toolkit), {"NOSTALL_NO_CUDA": "1"}) is not None


def test_setup_on_a_cuda_torch_without_nvcc_plans_the_cpu_libraries_and_says_why(tmp_path):
    """setup.py itself, in a copy of the tree, under a torch that claims CUDA 13.0 and finds no
    toolkit: it lists no CUDA extension and records the reason for the runtime."""
    shutil.copy(ROOT / "setup.py", tmp_path)
    (tmp_path / "nostall").mkdir()
    shutil.copy(ROOT / "nostall/_build_plan.py", tmp_path / "nostall")
    shutil.copytree(ROOT / "csrc", tmp_path / "csrc")
    script = (
        "import sys, torch, torch.utils.cpp_extension as ext\n"
        "torch.version.cuda = '13.0'; ext.CUDA_HOME = None\n"
        "sys.argv = ['setup.py', '--name']\n"
        "ns = {'__name__': '__main__'}\n"
        "exec(compile(open('setup.py').read(), 'setup.py', 'exec'), ns)\n"
        "print('extensions:', [e.name for e in ns['extensions']()])\n"
    )
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # (no nvcc on it)
    env.pop("NOSTALL_NO_CUDA", None)
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "nostall: building the CPU kernels only: torch" in run.stdout
    assert "extensions: ['nostall._C', 'nostall._C_autograd']" in run.stdout
    info = (tmp_path / "nostall/_build_info.py").read_text()
    assert "CUDA_KERNELS = False" in info and "no CUDA toolkit (nvcc)" in info


def test_without_cuda_kernels_a_cuda_call_is_refused_with_the_reason():
    """(In a process of its own: the refusing kernels stay registered.)"""
    script = (
        "import torch, nostall\n"
        "from nostall import _native\n"
        "kept = _native._refuse_cuda_calls('no CUDA toolkit when built')\n"
        "z, b = torch.zeros(4, 2), torch.zeros(4, 2, dtype=torch.bool)\n"
        "cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)\n"
        "try:\n"
        "    torch.ops.nostall.gae.default.redispatch(cuda, z, z, z, b, b, 0.99, 0.95)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
        "print(tuple(nostall.gae(z, z, z, b, b)[0].shape))\n"  # the CPU kernels are untouched
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == [
        "nostall::gae was given CUDA tensors, but this nostall has no CUDA kernels: no CUDA "
        "toolkit when built",
        "(4, 2)",
    ]
