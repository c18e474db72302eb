"""Trace analysis on synthetic torch.profiler traces whose answer is known."""

import gzip
import json

import pytest

from nostall.profiler import TraceError, analyze_trace


def kernel(ts, dur, corr, stream=7, device=0, cat="kernel"):
    return {
        "ph": "X",
        "cat": cat,
        "name": f"k{corr}",
        "ts": ts,
        "dur": dur,
        "pid": device,
        "tid": stream,
        "args": {"device": device, "stream": stream, "correlation": corr},
    }


def runtime(name, ts, dur, corr=None, tid=1):
    args = {} if corr is None else {"correlation": corr}
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 100,
        "tid": tid,
        "args": args,
    }


def host(cat, name, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 100, "tid": tid}


def known_trace():
    """Stream 7: A [100, 200); B [300, 350) launched at 280, after A ended: host wait 100,
    the host sitting in cudaStreamSynchronize under aten::item from train.py line 42; C
    [350.01, 400) queued long before: kernel wait 0.01; D [500, 600) queued before C ended:
    other 100. Stream 8: E [250, 280)."""
    return {
        "traceEvents": [
            runtime("cudaLaunchKernel", 90, 5, corr=1),
            runtime("cudaLaunchKernel", 120, 5, corr=3),
            runtime("cudaLaunchKernel", 130, 5, corr=4),
            host("python_function", "train.py(42): train_step", 95, 400),
            host("python_function", "/usr/lib/site-packages/torch/_tensor.py(10): item", 139, 80),
            host("cpu_op", "aten::item", 140, 70),
            host("cpu_op", "aten::_local_scalar_dense", 141, 68),
            runtime("cudaMemcpyAsync", 142, 5),
            runtime("cudaStreamSynchronize", 150, 55),
            runtime("cudaLaunchKernel", 240, 5, corr=5),
            runtime("cudaLaunchKernel", 280, 5, corr=2),
            kernel(100, 100, 1),
            kernel(300, 50, 2),
            kernel(350.01, 49.99, 3),
            kernel(500, 100, 4),
            kernel(250, 30, 5, stream=8),
            {"ph": "i", "name": "marker", "ts": 1},  # ignored: not a complete event
        ]
    }


def test_busy_idle_and_breakdown_per_stream():
    result = analyze_trace(known_trace())
    s7, s8 = result["streams"]
    assert (s7["stream"], s8["stream"]) == (7, 8)
    assert s7["busy_us"] == pytest.approx(299.99)
    assert s7["host_wait_us"] == pytest.approx(100)
    assert s7["kernel_wait_us"] == pytest.approx(0.01)
    assert s7["other_us"] == pytest.approx(100)
    assert s7["idle_us"] == pytest.approx(200.01)
    assert s8["busy_us"] == pytest.approx(30) and s8["idle_us"] == 0
    assert result["window_us"] == pytest.approx(500)
    assert result["busy_us"] == pytest.approx(329.99)
    assert result["idle_us"] == pytest.approx(170.01)


def test_host_wait_is_attributed_to_the_sync_call_and_user_line():
    (cause,) = analyze_trace(known_trace())["host_wait_causes"]
    assert cause["sync_call"] == "cudaStreamSynchronize"
    assert cause["op"] == "aten::_local_scalar_dense"
    assert cause["source"] == "train.py:42"
    assert cause["idle_us"] == pytest.approx(100)


def test_host_wait_without_a_sync_is_a_busy_host():
    trace = {
        "traceEvents": [
            runtime("cudaLaunchKernel", 10, 2, corr=1),
            runtime("cudaLaunchKernel", 150, 2, corr=2),
            kernel(20, 30, 1),
            kernel(160, 40, 2),
        ]
    }
    result = analyze_trace(trace)
    assert result["host_wait_us"] == pytest.approx(110)
    (cause,) = result["host_wait_causes"]
    assert cause["sync_call"] == "no sync call (host busy)" and cause["source"] is None


def test_kernel_wait_threshold_is_configurable():
    trace = {
        "traceEvents": [
            runtime("cudaLaunchKernel", 0, 1, corr=1),
            runtime("cudaLaunchKernel", 1, 1, corr=2),
            kernel(10, 10, 1),
            kernel(25, 10, 2, cat="gpu_memcpy"),
        ]
    }
    assert analyze_trace(trace)["streams"][0]["other_us"] == pytest.approx(5)
    relaxed = analyze_trace(trace, consecutive_kernel_delay_us=10)
    assert relaxed["streams"][0]["kernel_wait_us"] == pytest.approx(5)


def test_trace_without_device_activity():
    result = analyze_trace({"traceEvents": [host("cpu_op", "aten::add", 0, 5)]})
    assert result["streams"] == [] and result["window_us"] == 0


def test_reads_json_and_gzip_files(tmp_path):
    plain = tmp_path / "trace.json"
    plain.write_text(json.dumps(known_trace()))
    packed = tmp_path / "trace.json.gz"
    with gzip.open(packed, "wt") as f:
        json.dump(known_trace(), f)
    assert analyze_trace(plain) == analyze_trace(packed) == analyze_trace(known_trace())


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no trace file"),
        ("{not json", "cannot read"),
        ('{"events": []}', "no 'traceEvents' list"),
        ("[1, 2]", "no 'traceEvents' list"),
    ],
)
def test_unreadable_traces_raise_trace_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TraceError, match=message):
        analyze_trace(path)
