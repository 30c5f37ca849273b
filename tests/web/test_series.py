"""Bounded, spike-preserving history (web.series) and distributions over time (web.dists)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from web.dists import DistHistory, heatmap, histogram
from web.series import StepTable


def _fill(table: StepTable, n: int, spikes: dict[int, float] | None = None, start: int = 0):
    rng = random.Random(1)
    spikes = spikes or {}
    for s in range(start, start + n):
        v = spikes.get(s, 1.0 + 0.01 * rng.random())
        table.append(s, 1000.0 + s, {"kl/mean": v, "reward/mean": s / n}, {"kl/mean": 1.0, "reward/mean": s / n})


def test_short_run_is_kept_step_by_step():
    t = StepTable(capacity=64)
    _fill(t, 10)
    v = t.view()
    assert v["step"] == list(range(10))
    assert v["ts"] == [1000.0 + s for s in range(10)]
    assert len(v["raw"]["kl/mean"]) == 10
    assert v["bucket_steps"] == 1
    assert v["ema"]["reward/mean"][-1] == pytest.approx(0.9)


def test_memory_stays_bounded_and_spikes_survive_a_long_run():
    t = StepTable(capacity=256)
    n = 100_000
    _fill(t, n, spikes={37_123: 250.0, 81_000: -40.0})
    assert t.size <= 256
    assert t.width & (t.width - 1) == 0            # a power of two
    v = t.view()
    raw = [x for x in v["raw"]["kl/mean"] if x is not None]
    assert max(raw) == 250.0 and min(raw) == -40.0  # one-step spikes at full height
    assert v["step"][0] == 0 and v["step"][-1] == n - 1
    assert len(v["step"]) <= 2 * 256
    assert all(a <= b for a, b in zip(v["step"], v["step"][1:]))
    # the spike is drawn near the step where it happened (within one bucket)
    i = v["raw"]["kl/mean"].index(250.0)
    assert abs(v["step"][i] - 37_123) <= v["bucket_steps"]


def test_view_downsamples_further_on_request_and_keeps_extremes():
    t = StepTable(capacity=1024)
    _fill(t, 1000, spikes={500: 9.0})
    v = t.view(points=50)
    assert len(v["step"]) <= 100
    assert 9.0 in v["raw"]["kl/mean"]
    assert v["bucket_steps"] >= 1000 // 50


def test_extremes_are_drawn_in_the_order_they_happened():
    t = StepTable(capacity=4)
    for s, x in enumerate([5.0, 1.0, 2.0, 9.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]):
        t.append(s, float(s), {"m": x}, {"m": x})
    v = t.view()
    # the first bucket (steps 0..7 after two compactions) saw the min (1 at step 1) before the max (9 at step 3)
    assert v["raw"]["m"][:2] == [1.0, 9.0]


def test_non_finite_values_are_gaps_and_flagged():
    t = StepTable(capacity=8)
    for s, x in enumerate([1.0, math.nan, 2.0, math.inf]):
        t.append(s, float(s), {"m": x}, {"m": 1.0})
    v = t.view()
    assert v["raw"]["m"] == [1.0, None, 2.0, None]
    assert v["bad"]["m"] == [1, 3]
    _fill(t, 100, start=4)        # compaction keeps the count
    assert t.view()["bad"]["m"]


def test_metric_appearing_later_has_no_values_before():
    t = StepTable(capacity=16)
    t.append(0, 0.0, {"a": 1.0}, {"a": 1.0})
    t.append(1, 1.0, {"a": 1.0, "b": 5.0}, {"a": 1.0, "b": 5.0})
    v = t.view()
    assert v["raw"]["b"] == [None, 5.0]


def test_metric_cap():
    t = StepTable(capacity=8, max_metrics=3)
    t.append(0, 0.0, {f"m{i}": 1.0 for i in range(5)}, {})
    assert len(t.metrics()) == 3 and len(t.dropped_metrics) == 2


def test_truncate_after_a_rollback():
    t = StepTable(capacity=64)
    _fill(t, 40)
    t.truncate_after(19)
    assert t.view()["step"][-1] == 19
    _fill(t, 5, start=20)
    assert t.view()["step"][-5:] == [20, 21, 22, 23, 24]


def test_capacity_must_be_even():
    with pytest.raises(ValueError):
        StepTable(capacity=5)


def test_distribution_history_is_bounded_and_follows_a_shift():
    h = DistHistory(capacity=16)
    rng = np.random.default_rng(0)
    for s in range(500):
        h.add(s, float(s), (rng.normal(0, 1, 64) + (5.0 if s >= 250 else 0.0)).tolist())
    assert len(h.q) <= 16
    assert h.latest_step == 499 and len(h.latest) == 64
    hm = heatmap(h, bins=20)
    assert len(hm["density"]) == len(h.q) and len(hm["edges"]) == 21
    for col in hm["density"]:
        assert sum(col) == pytest.approx(1.0, abs=0.02)
    assert hm["median"][0] < 1.0 and hm["median"][-1] > 4.0
    assert hm["steps"] == sorted(hm["steps"]) and hm["steps"][-1] == 499


def test_distribution_extremes_survive_merging():
    h = DistHistory(capacity=4)
    for s in range(64):
        h.add(s, float(s), [0.0, 1.0, 100.0 if s == 17 else 2.0])
    assert max(q[-1] for q in h.q) == 100.0


def test_histogram_and_empty_inputs():
    out = histogram([1, 2, 2, 3, float("nan")], bins=4)
    assert sum(out["counts"]) == 4 and len(out["edges"]) == 5
    assert histogram([]) == {"edges": [], "counts": []}
    assert histogram([2.0, 2.0])["counts"][0] + histogram([2.0, 2.0])["counts"][-1] >= 0
    assert heatmap(DistHistory())["density"] == []
    h = DistHistory()
    h.add(0, 0.0, [math.nan])
    assert h.latest_step is None
