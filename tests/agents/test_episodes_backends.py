"""Episodes on every transport (thread, process, Ray): failing environments end their episodes
and are counted while the run goes on, and a resume from the k-th checkpoint is exact (at
staleness 1 too: the batches queued at the checkpoint come back from it)."""

import dataclasses
import gc
import os
import time

import pytest
import torch.multiprocessing as mp

from nostall.algos import grpo

FAST = dict(
    task="guess", steps=4, num_prompts=4, num_generations=2, watch_syncs=False, log_interval=1
)
BACKENDS = ["thread", "process", "ray"]


def _ray_or_skip(backend, request):
    if backend == "ray":  # (a local cluster for the module: skipped where Ray is not installed)
        request.getfixturevalue("local_cluster")


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_failing_environments_end_their_episodes_and_the_run_goes_on(backend, isolation, request):
    """In threads, and in processes of their own (the hung one's process killed at the
    timeout): no environment process is left once the run is over."""
    _ray_or_skip(backend, request)
    args = grpo.GRPOCommandConfig(
        **dict(FAST, task="copy"),
        environment="tests.agents.text_envs:Faulty",
        max_turn_tokens=1,
        max_new_tokens=8,
        tool_timeout=0.5,
        backend=backend,
        env_isolation=isolation,
    )
    logged = []
    result = grpo.train(args, log=lambda step, values: logged.append(values))
    assert len(result.rewards) == args.steps
    failed = sum(v["episodes/failed"] for v in logged)
    truncated = sum(v["episodes/truncated"] for v in logged)
    assert failed > 0 and truncated > 0  # (the hung, crashed and garbage ones; the endless)
    assert all(0 < v["tools/failure_frequency"] <= 1 for v in logged if v["episodes/failed"])
    assert mp.active_children() == []
    del result
    gc.collect()  # (the run's pool, if this process held it: collected, its hosts killed)
    assert wait_no_hosts(), "an environment process outlived its run"


def wait_no_hosts(within_s: float = 20.0) -> bool:
    """Whether every environment host process has ended (within a bound for a slow machine;
    a host whose trainer process is gone ends by itself within a second)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not hosts_running():
            return True
        time.sleep(0.1)
    return False


def hosts_running() -> list[int]:
    running = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    command = f.read()
                with open(f"/proc/{entry}/status") as f:
                    zombie = any(line.startswith("State:") and "Z" in line for line in f)
            except OSError:
                continue
            if b"env_host.py" in command and not zombie:
                running.append(int(entry))
    return running


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("staleness", [0, 1])
def test_resume_from_a_checkpoint_is_exact(tmp_path, backend, staleness, request):
    _ray_or_skip(backend, request)
    args = grpo.GRPOCommandConfig(
        **dict(FAST, steps=6),
        staleness=staleness,
        checkpoint=str(tmp_path / "c-{step}.pt"),
        checkpoint_every=3,
    )
    full = grpo.train(args)
    resumed = grpo.train(
        dataclasses.replace(args, backend=backend, resume=str(tmp_path / "c-3.pt"), checkpoint=None)
    )
    assert resumed.rewards == full.rewards
    assert mp.active_children() == []


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_the_timeline_and_report_show_decode_tool_and_idle_time(tmp_path, backend):
    """Every environment call the batches counted is a "tool" span of the run's timeline, from
    whichever process generated; decode rounds and the decoder's waits are spans too; the report
    gives their counts, times and the decoder's idle share, and the plot draws their lanes."""
    import json

    from nostall.train.outputs import EPISODE_LANES

    args = grpo.GRPOCommandConfig(
        **FAST, backend=backend, output_dir=str(tmp_path), report_to="none"
    )
    logged = []
    result = grpo.train(args, log=lambda step, values: logged.append(values))
    timeline = result.timeline
    assert timeline.count("tool") == sum(v["episodes/env_calls"] for v in logged) > 0
    assert timeline.count("decode") > 0 and timeline.count("idle") > 0
    assert {side for side, _, _ in timeline.spans} >= {lane for lane, _, _ in EPISODE_LANES}
    report = json.loads((tmp_path / "report.json").read_text())
    timing = report["episodes"]
    assert timing["tool_calls"] == timeline.count("tool")
    assert 0 < timing["decoder_idle_fraction"] < 1
    assert "environment calls" in (tmp_path / "report.txt").read_text()
    assert (tmp_path / "timeline.png").stat().st_size > 0
