"""nostall's PEP 517 build backend: setuptools', building against the torch that will import it.

A native extension must be compiled against the torch that loads it (the autograd library uses
torch's C++ ABI). With build isolation (pip's default), the build gets its own torch from the
build requirements, and an open requirement like `torch>=2.10` gives the newest release, often
a CUDA build of a different version than the one installed. So the torch requirement is added
here, pinned to the torch of the environment being installed into: the interpreter running
this hook is that environment's (pip's isolation hides its packages from sys.path, not from a
fresh `python -I`). Where that environment has no torch, the version nostall is tested with
is pinned. NOSTALL_BUILD_TORCH (a requirement, e.g. "torch==2.14.1") overrides both.
"""

from __future__ import annotations

import os
import subprocess
import sys

from setuptools.build_meta import *  # noqa: F403  (the hooks not overridden below)

TESTED_TORCH = "torch==2.13.0"


def torch_requirement() -> str:
    explicit = os.environ.get("NOSTALL_BUILD_TORCH")
    if explicit:
        return explicit
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    try:
        found = subprocess.run(
            [sys.executable, "-I", "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        found = None
    version = found.stdout.strip() if found is not None and found.returncode == 0 else ""
    requirement = f"torch=={version}" if version else TESTED_TORCH
    why = (
        "the target environment's"
        if version
        else "no torch in the target environment (a build frontend's own venv, as in "
        "`python -m build`, has none): the version nostall is tested with; "
        "NOSTALL_BUILD_TORCH=torch==X picks another"
    )
    print(f"nostall: building against {requirement} ({why})", file=sys.stderr)
    return requirement


# setuptools' own hooks would run setup.py to find setup_requires, and setup.py imports torch,
# which is what these hooks are asked for: nostall has no setup_requires, so only torch is added
# to build-system.requires.
def get_requires_for_build_wheel(config_settings=None):
    return [torch_requirement()]


def get_requires_for_build_sdist(config_settings=None):
    return [torch_requirement()]


def get_requires_for_build_editable(config_settings=None):
    return [torch_requirement()]
