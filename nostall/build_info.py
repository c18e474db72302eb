"""What the native library was built against (no native code: importable when it fails)."""

REBUILD = "pip install --no-build-isolation -e .  (or: make build)"


def built_for() -> str | None:
    """The torch version the native library was built against (written by setup.py)."""
    try:
        from nostall._build_info import TORCH_VERSION
    except ImportError:
        return None
    return TORCH_VERSION


def cuda_skipped() -> str | None:
    """Why the build made no CUDA kernels (None: it made them, or nothing records why)."""
    try:
        from nostall._build_info import CUDA_SKIPPED
    except ImportError:  # (a build from before the reason was recorded)
        return None
    return CUDA_SKIPPED
