"""A run of many short steps ends as a short one does: what its report computes and what it
keeps grow no faster than its steps (the work counted, never timed), its overlap figure is the
whole run's, and its plots draw a bounded number of points."""

import json

from nostall.algos import grpo
from nostall.runtime import timeline as timeline_module
from nostall.runtime.overlap import overlap_fraction
from nostall.train import outputs


def test_a_run_of_many_short_steps_keeps_and_reports_in_linear_work(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline_module, "KEPT_SPANS", 64)
    every_span = []
    record = timeline_module.Timeline._add

    def watched(self, side, start, end):
        every_span.append((side, start, end))
        record(self, side, start, end)

    monkeypatch.setattr(timeline_module.Timeline, "_add", watched)
    steps = 1200
    args = grpo.GRPOCommandConfig(
        steps=steps,
        num_prompts=2,
        num_generations=2,
        max_new_tokens=2,
        watch_syncs=False,
        log_interval=100,
        output_dir=str(tmp_path),
    )
    result = grpo.train(args)
    timeline = result.timeline
    assert timeline.recorded == len(every_span) >= 2 * steps
    assert len(timeline.spans) == 64  # the plot's spans: the first, not the run's
    meter = timeline._meters[("train", "rollout")]
    assert meter.cut > 0  # folded as the run went
    assert meter.work <= 3 * timeline.recorded  # the overlap's cost, over the whole run
    report = json.loads((tmp_path / "report.json").read_text())
    whole = overlap_fraction(every_span, "train", "rollout")
    assert report["update_overlap"] == round(whole, 3) and report["timeline_late_s"] == 0.0
    assert report["steps"] == steps


def test_long_curves_are_drawn_downsampled_with_their_running_mean():
    n = 200_001
    x = [float(i) for i in range(n)]
    y = [float(i % 7) for i in range(n)]
    xs, ys = outputs.downsampled(x, y)
    assert len(xs) == len(ys) <= outputs.CURVE_POINTS
    assert abs(sum(ys) / len(ys) - sum(y) / n) < 0.01 and xs[0] < xs[-1]
    assert outputs.downsampled(x[:10], y[:10]) == (x[:10], y[:10])
    window = [sum(y[max(0, i - 9) : i + 1]) / min(10, i + 1) for i in range(50)]
    got = outputs.running_mean(y[:50], 10)
    assert max(abs(a - b) for a, b in zip(got, window, strict=True)) < 1e-12
