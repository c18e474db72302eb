"""SyncWatch and trace analysis on a real GPU."""

import pytest
import torch

from nostall.profiler import SyncWatch, analyze_trace

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present"),
]


def test_cuda_tensors_are_device_tensors_and_cuda_debug_mode_agrees():
    x = torch.randn(1000, device="cuda")
    with SyncWatch() as watch:
        y = (x * 2).sum()
        y.item()
        x[x > 0].sum()
        (x * 3).cpu()
    kinds = [e.kind for e in watch.events]
    assert kinds == ["item", "boolean mask indexing", "copy to host"]
    assert watch.cuda_warnings, "CUDA's sync debug mode saw no sync"
    assert watch.report().cuda_warnings_unmatched == []


def test_real_trace_attributes_host_wait_to_the_sync(tmp_path):
    x = torch.randn(4096, 4096, device="cuda")
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        for _ in range(5):
            y = x @ x
            y.sum().item()  # the host waits here, then launches the next matmul late
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    result = analyze_trace(path)
    assert result["busy_us"] > 0 and result["host_wait_us"] > 0
    causes = result["host_wait_causes"]
    assert any("Synchronize" in c["sync_call"] or "Memcpy" in c["sync_call"] for c in causes)
    assert any(c["source"] and "test_profiler_cuda.py" in c["source"] for c in causes)
