"""The timeline's figures: how much of one side's time another side was busy (the weight
pushes' overlap with the update, the rollout side's with the updates in every report), against
a count of unit cells, and spans timed by the wall clock in another process placed on this
one's timeline."""

import time

from hypothesis import given
from hypothesis import strategies as st

from nostall.runtime.timeline import Timeline, overlap_fraction
from nostall.train.result import TrainResult


def test_overlap_counts_each_moment_once():
    spans = [("push", 0.0, 1.0), ("train", 0.2, 0.6), ("train", 0.4, 0.8), ("rollout", 0, 1)]
    assert abs(overlap_fraction(spans, "push", "train") - 0.6) < 1e-12
    assert abs(overlap_fraction([*spans, ("push", 2.0, 3.0)], "push", "train") - 0.3) < 1e-12
    assert overlap_fraction(spans, "push", "nothing") == 0.0
    assert overlap_fraction(spans, "absent", "train") is None


intervals = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 6)), max_size=8)


@given(intervals, intervals)
def test_overlap_matches_a_count_of_unit_cells(pushes, trains):
    spans = [("push", float(s), float(s + n)) for s, n in pushes]
    spans += [("train", float(s), float(s + n)) for s, n in trains]
    busy = {t for s, n in trains for t in range(s, s + n)}
    cells = [t for s, n in pushes for t in range(s, s + n)]  # (pushes may overlap each other)
    got = overlap_fraction(spans, "push", "train")
    if not cells:
        assert got is None
    else:
        assert abs(got - sum(t in busy for t in cells) / len(cells)) < 1e-12


def test_wall_clock_spans_land_where_the_local_clock_puts_them():
    timeline = Timeline()
    local = time.perf_counter()
    wall = time.time()
    timeline.record_wall("push", wall, wall + 0.5)
    timeline.record_wall("push", wall - 3600.0, wall - 3599.0)  # an earlier run's: left out
    [(side, start, end)] = timeline.spans
    assert side == "push" and abs(start - (local - timeline.origin)) < 5e-3
    assert abs(end - start - 0.5) < 1e-6


def test_every_report_gives_the_updates_overlap_with_the_rollout_side():
    result = TrainResult(timeline=[("train", 0.0, 1.0), ("rollout", 0.75, 2.0), ("train", 2, 3)])
    summary = result.summary()
    assert summary["update_overlap"] == 0.125
    assert "rollout ran during 12% of the updates' time" in "\n".join(result.summary_lines(summary))
    assert TrainResult().summary()["update_overlap"] is None  # no update timed
