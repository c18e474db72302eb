"""What the native library was built against (no native code: importable when it fails)."""

REBUILD = "pip install --no-build-isolation -e .  (or: make build)"


def built_for() -> str | None:
    """The torch version the native library was built against (written by setup.py)."""
    try:
        from nostall._build_info import TORCH_VERSION
    except ImportError:
        return None
    return TORCH_VERSION
