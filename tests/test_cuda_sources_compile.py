"""Every CUDA source compiles with nvcc, checked also on machines without a GPU or CUDA torch."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_sources_compile_with_nvcc():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_cuda_compiles.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
