"""The timeline's figures: how much of one side's time another side was busy (the weight
pushes' overlap with the update, the rollout side's with the updates in every report), against
a count of unit cells, and spans timed by the wall clock in another process placed on this
one's timeline."""

import time

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.loop.outputs_cost import alternating_run
from nostall.runtime.overlap import OverlapMeter
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


# -- a run of any length: the figures folded as the spans arrive -------------------------------


def test_a_long_runs_overlap_is_the_whole_runs_at_a_bounded_cost():
    for steps in (3_000, 30_000):
        spans = alternating_run(steps)
        timeline = Timeline.of(spans, kept=64)
        meter = timeline._meters[("train", "rollout")]
        whole = overlap_fraction(spans, "train", "rollout")
        assert abs(timeline.overlap("train", "rollout") - whole) < 1e-9
        # Each span measured about twice over the run, whatever its length (a walk of every
        # pair, as before, is steps x steps); what is kept stays bounded.
        assert meter.work <= 3 * len(spans), (steps, meter.work)
        assert len(meter.pending) <= 2 * meter.base_fold_at
        assert len(timeline.spans) == 64 and timeline.recorded == len(spans)
        assert timeline.late_s == 0.0
        for side in ("train", "rollout"):
            lengths = [e - s for name, s, e in spans if name == side]
            assert abs(timeline.mean_ms(side) - 1e3 * sum(lengths) / len(lengths)) < 1e-9


sides = st.sampled_from(["train", "rollout", "push"])
spans_in_any_order = st.lists(st.tuples(sides, st.integers(0, 400), st.integers(1, 9)), max_size=99)


@given(spans_in_any_order)
def test_the_folded_overlap_equals_the_batch_one_while_spans_arrive_within_the_horizon(raw):
    """Spans recorded at their ends (a horizon of 8 times the longest covers any that waits a
    few spans): the meter folding every 8 spans gives overlap_fraction's figure."""
    spans = sorted(((side, float(s), float(s + n)) for side, s, n in raw), key=lambda x: x[2])
    meter = OverlapMeter("train", "rollout", fold_at=8, min_horizon_s=0.0)
    for span in spans:
        meter.add(*span)
    want = overlap_fraction(spans, "train", "rollout")
    got = meter.fraction()
    assert meter.late_s == 0.0
    assert (got is None) == (want is None) and (got is None or abs(got - want) < 1e-9)


def test_a_span_reaching_back_past_the_fold_is_reported_not_hidden():
    meter = OverlapMeter("train", "rollout", fold_at=4, min_horizon_s=0.0)
    for i in range(8):
        meter.add("train", float(i), i + 0.5)
        meter.add("rollout", float(i), i + 0.25)
    assert meter.cut > 0
    meter.add("rollout", -100.0, 7.5)  # began long before the cut
    assert meter.late_s > 0
    result = TrainResult(timeline=[])
    result.timeline._meters[("train", "rollout")] = meter
    summary = result.summary()
    assert summary["timeline_late_s"] == round(meter.late_s, 3)
    assert "began too far back" in "\n".join(result.summary_lines(summary))
