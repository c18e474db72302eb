import os

import pytest

from tests.vllm.tiny_model import save_tiny_model

# `make test-vllm` sets this: there a missing vLLM fails the run instead of skipping it.
REQUIRED = os.environ.get("NOSTALL_REQUIRE_VLLM") == "1"

try:
    import vllm  # noqa: F401

    HAS_VLLM = True
except ImportError:
    if REQUIRED:
        raise
    HAS_VLLM = False


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(
        reason="vLLM is not installed in this venv: `make test-vllm` "
        "runs these in a venv of their own (it pins its own "
        "transformers)"
    )
    for item in items:
        if "tests/vllm/" in str(item.fspath) and not HAS_VLLM:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A head-size-64 tiny Qwen2 over the character tokenizer (vLLM's CPU attention refuses
    the built-in tiny's head size 16)."""
    return save_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny64")
