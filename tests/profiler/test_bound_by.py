"""What a loop is bound by, from a torch.profiler trace: a hand-built trace whose split is known
to the microsecond, a trace recorded from a real loop (a CleanRL-style PPO over Gymnasium), the
command's table, JSON and plot, and bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nostall.profiler import TraceError, analyze_bound_by, phase

ROOT = Path(__file__).resolve().parent.parent.parent
TID = 7


def _x(name, cat, ts, dur, tid=TID):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_a_hand_built_trace_splits_exactly():
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 100),
        _x("gymnasium/vector/sync_vector_env.py(275): step", "python_function", 0, 10),
        _x("aten::addmm", "cpu_op", 10, 5),  # a forward op not backpropagated: inference
        _x("aten::mm", "cpu_op", 15, 5),  # a forward op linked to its backward: update
        {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 1, "ts": 15, "pid": 1, "tid": TID},
        _x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", 20, 10),
        _x("MmBackward0", "cpu_op", 21, 8),  # nested: counted once
        _x("Optimizer.step#Adam.step", "user_annotation", 30, 5),
        _x("nostall.phase:inference", "user_annotation", 35, 10),  # the user's range
        _x("cudaStreamSynchronize", "cuda_runtime", 36, 4),  # inside it: waiting wins
        _x("cudaMemcpyAsync", "cuda_runtime", 50, 5),
        _x("nostall::env_step", "cpu_op", 60, 10),
        _x("aten::add", "cpu_op", 60, 3, tid=TID + 1),  # another, quieter thread: not counted
        # 45-50, 55-60 and 70-100: nothing, the interpreter.
    ]
    bound = analyze_bound_by({"traceEvents": events})
    assert bound.wall_us == 100 and bound.steps == 1
    assert bound.by_category == {
        "environment step": 20.0,
        "policy inference": 5.0 + 6.0,
        "update": 5.0 + 10.0 + 5.0,
        "host-device transfer": 5.0,
        "waiting": 4.0,
        "other (Python)": 5.0 + 5.0 + 30.0,
    }
    assert bound.bound_by == "other (Python)"
    table = bound.table()
    assert "bound by: other (Python) (40% of 0.1 ms)" in table
    assert "ms/step" in table


def test_phase_names_are_checked_and_cost_nothing_without_a_profiler():
    with phase("env"):
        pass
    with pytest.raises(ValueError, match="phase must be one of env, inference"):
        with phase("rollout"):
            pass


def test_a_trace_without_host_events_is_an_error():
    with pytest.raises(TraceError, match="no host events"):
        analyze_bound_by({"traceEvents": [_x("k", "kernel", 0, 1)]})


def test_a_real_loop_is_split_and_the_command_prints_and_plots_it(tmp_path):
    """A CleanRL-style PPO (examples/cleanrl_ppo.py, unchanged) recorded with stacks: its
    environment steps, its rollout forwards and its update each get their share."""
    trace = tmp_path / "trace.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "cleanrl_ppo.py"),
            "--iterations",
            "1",
            "--num-steps",
            "16",
            "--trace",
            str(trace),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    bound = analyze_bound_by(trace)
    shares = {c: ms / bound.wall_us for c, ms in bound.by_category.items()}
    assert abs(sum(bound.by_category.values()) - bound.wall_us) < 1e-6 * bound.wall_us
    for category in ("environment step", "policy inference", "update", "other (Python)"):
        assert shares[category] > 0.005, (category, shares)
    # A CPU run has no device: nothing is transferred or waited for.
    assert shares["host-device transfer"] == 0 and shares["waiting"] == 0
    plot = tmp_path / "bound.png"
    out = subprocess.run(
        [sys.executable, "-m", "nostall.cli", "trace", str(trace), "--json", "--plot", str(plot)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["bound_by"]["bound_by"] == bound.bound_by
    assert report["bound_by"]["ms"]["update"] == pytest.approx(bound.by_category["update"] / 1e3)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_phases_mark_a_loop_recorded_without_stacks(tmp_path):
    """Without stacks an environment step is plain Python; the user's phase() names it."""
    net = torch.nn.Linear(4, 2)
    net(torch.randn(8, 4))  # warm-up, outside the trace
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with phase("env"):
                sum(i * i for i in range(200_000))  # an environment written in Python
            with phase("inference"), torch.no_grad():
                net(torch.randn(8, 4))
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    bound = analyze_bound_by(path)
    assert bound.by_category["environment step"] > bound.by_category["policy inference"] > 0
