"""SyncWatch behaviour: source lines, allow(), steps, tracking, assert_no_sync, threads."""

import threading

import pytest
import torch

import nostall.profiler as profiler
from nostall.profiler import SyncError, SyncWatch, assert_no_sync


def _this_line() -> int:
    import inspect

    return inspect.currentframe().f_back.f_lineno


def _helper_that_syncs(t: torch.Tensor) -> float:
    return t.sum().item()  # the reported line: the user's code, wherever torch is called from


def test_reports_the_users_file_and_line():
    policy = torch.nn.Linear(4, 2)
    with SyncWatch(policy) as watch:
        out = policy(torch.randn(3, 4))
        line = _this_line() + 1
        out.max().item()
        _helper_that_syncs(out)
    sites = {(e.file, e.line, e.function) for e in watch.events}
    assert (__file__, line, "test_reports_the_users_file_and_line") in sites
    helper_line = _helper_that_syncs.__code__.co_firstlineno + 1
    assert (__file__, helper_line, "_helper_that_syncs") in sites


def test_allow_counts_intended_syncs_apart():
    w = torch.nn.Parameter(torch.ones(3))
    with SyncWatch() as watch:
        for _ in range(4):
            loss = (w * 2).sum()
            with watch.allow("logging"):
                loss.item()
            watch.step()
    report = watch.report()
    assert report.unintended == []
    assert report.intended_count == 4
    assert report.intended[0].reason == "logging"
    assert report.intended[0].per_step == 1.0
    assert "intended" in report.table() and "logging" in report.table()


def test_counts_per_step_and_steps_with_a_sync():
    w = torch.nn.Parameter(torch.ones(3))
    with SyncWatch() as watch:
        for step in range(10):
            if step % 5 == 0:
                (w * 2).sum().item()
            watch.step()
    (site,) = watch.report().unintended
    assert site.count == 2 and site.steps_with_sync == 2 and site.per_step == 0.2


def test_tensors_derived_from_marked_tensors_are_tracked_and_host_ones_are_not():
    obs = torch.randn(5)
    host = torch.randn(5)
    with SyncWatch(tensors=(obs,)) as watch:
        derived = (obs * 2).exp()
        view = derived[1:]
        written = torch.zeros(4)
        written.copy_(view)  # an in-place write from a device tensor makes `written` device
        written.sum().item()
        host.sum().item()  # host bookkeeping: not a sync
    assert [e.kind for e in watch.events] == ["item"]


def test_all_tensors_mode_counts_host_tensors_too():
    with SyncWatch(all_tensors=True) as watch:
        torch.randn(3).sum().item()
    assert len(watch.events) == 1


def test_decorator_and_module_level_helpers():
    w = torch.nn.Parameter(torch.ones(2))
    watch = SyncWatch()

    @watch
    def step():
        profiler.mark_step()
        with profiler.allow("print"):
            (w + 1).sum().item()
        (w + 1).sum().item()

    step()
    step()
    report = watch.report()
    assert watch.steps == 2 and report.intended_count == 2 and report.unintended_count == 2
    profiler.mark_step()  # no active watch: a no-op
    with profiler.allow("nothing"):
        pass


def test_assert_no_sync_passes_clean_code_and_fails_with_the_sites():
    w = torch.nn.Parameter(torch.ones(3))
    with assert_no_sync():
        (w * 2).sum()
    with pytest.raises(SyncError, match="bool"), assert_no_sync():
        if (w * 2).sum() > 0:
            pass


def test_the_watch_is_per_thread():
    w = torch.nn.Parameter(torch.ones(3))
    with SyncWatch() as watch:
        other = threading.Thread(target=lambda: (w * 2).sum().item())
        other.start()
        other.join()
    assert watch.events == []


def test_json_report_is_serialisable():
    import json

    w = torch.nn.Parameter(torch.ones(3))
    with SyncWatch() as watch:
        (w * 2).tolist()
    data = json.loads(json.dumps(watch.report().to_dict()))
    assert data["unintended_syncs"] == 1
    assert data["unintended"][0]["kind"] == "tolist"
