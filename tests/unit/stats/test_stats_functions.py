"""Pure functions (distribution shape, cross-rank comparisons) and the stateful helpers that
are not scalar statistics (GroupTrends, SeriesStore)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import scipy.stats
from _stats_helpers import hsettings, nonfinite
from hypothesis import given
from hypothesis import strategies as st

import streams.stats as S
from streams.stats import distribution as D


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# well-conditioned values (scipy itself is not exact on cancellation-prone data and its squares
# underflow for tiny values - the extremes are covered by the scale test below), plus non-finite
# values that must be ignored
sample_values = st.one_of(
    st.integers(-50, 50).map(float),
    st.floats(-1e3, 1e3, allow_nan=False).filter(lambda v: v == 0 or abs(v) > 1e-6),
    nonfinite,
)
arrays = st.lists(sample_values, max_size=60).map(lambda v: np.array(v, dtype=float))


def _finite(a):
    return a[np.isfinite(a)]


@hsettings(150)
@given(xs=arrays)
def test_skewness_kurtosis_bimodality_vs_scipy(xs):
    f = _finite(xs)
    sk, ku, bc = D.skewness(xs), D.kurtosis_excess(xs), D.bimodality_coefficient(xs)
    constant = f.size == 0 or np.all(f == f[0])
    if f.size < 3 or constant:
        assert math.isnan(sk)
    else:
        want = _quiet(scipy.stats.skew, f, bias=False)
        assert sk == pytest.approx(want, rel=1e-7, abs=1e-9)
    if f.size < 4 or constant:
        assert math.isnan(ku) and math.isnan(bc)
    else:
        want_k = _quiet(scipy.stats.kurtosis, f, bias=False, fisher=True)
        assert ku == pytest.approx(want_k, rel=1e-7, abs=1e-9)
        n = f.size
        want_bc = (_quiet(scipy.stats.skew, f, bias=False) ** 2 + 1) / (
            want_k + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3))
        )
        assert bc == pytest.approx(want_bc, rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("scale", [1e-300, 1e-150, 1e150, 1e300])
def test_shape_is_scale_free_at_the_float_limits(scale):
    rnd = np.random.default_rng(0)
    x = rnd.gamma(2.0, size=200)
    assert D.skewness(x * scale) == pytest.approx(D.skewness(x), rel=1e-9)
    assert D.kurtosis_excess(x * scale) == pytest.approx(D.kurtosis_excess(x), rel=1e-9)
    assert D.bimodality_coefficient(x * scale) == pytest.approx(
        D.bimodality_coefficient(x), rel=1e-9
    )


def test_bimodality_coefficient_separates_shapes():
    rnd = np.random.default_rng(1)
    uni = rnd.normal(size=5000)
    bi = np.concatenate([rnd.normal(-3, 0.5, 2500), rnd.normal(3, 0.5, 2500)])
    assert D.bimodality_coefficient(uni) < 0.4
    assert D.bimodality_coefficient(bi) > 5 / 9


@hsettings(100)
@given(xs=arrays, qs=st.lists(st.floats(0, 1), min_size=1, max_size=5))
def test_quantiles_histogram_tails(xs, qs):
    f = _finite(xs)
    got = D.quantiles(xs, qs)
    if f.size == 0:
        assert np.all(np.isnan(got))
    else:
        np.testing.assert_array_equal(got, np.quantile(f, qs))
        assert D.quantiles(xs, 0.5) == float(np.quantile(f, 0.5))
    counts, edges = D.histogram(xs, bins=7)
    want_c, want_e = np.histogram(f, bins=7)
    np.testing.assert_array_equal(counts, want_c)
    np.testing.assert_array_equal(edges, want_e)
    if f.size:
        assert D.tail_mass(xs, 10.0) == np.mean(f > 10.0)
        assert D.frac_at_cap(xs, 50.0) == np.mean(f >= 50.0)
        assert D.frac_at_cap(xs, 50.0, tol=5.0) == np.mean(f >= 45.0)
    else:
        assert math.isnan(D.tail_mass(xs, 0.0)) and math.isnan(D.frac_at_cap(xs, 1.0))
    with pytest.raises(ValueError):
        D.quantiles(xs, [1.5])
    with pytest.raises(ValueError):
        D.frac_at_cap(xs, 1.0, tol=-1.0)


@hsettings(150)
@given(
    pairs=st.lists(st.tuples(sample_values, sample_values), max_size=50),
)
def test_spearman_and_ranks_vs_scipy(pairs):
    x = np.array([p[0] for p in pairs], dtype=float)
    y = np.array([p[1] for p in pairs], dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    fx, fy = x[keep], y[keep]
    got = D.spearman(x, y)
    if fx.size < 3 or np.all(fx == fx[0]) or np.all(fy == fy[0]):
        assert math.isnan(got)
    else:
        want = _quiet(scipy.stats.spearmanr, fx, fy).statistic
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    if fx.size:
        np.testing.assert_array_equal(D.rankdata(fx), scipy.stats.rankdata(fx))


def test_spearman_input_checks():
    with pytest.raises(ValueError):
        D.spearman([1, 2, 3], [1, 2])
    assert D.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert math.isnan(D.spearman([1, 2], [1, 2]))


# ---- ranks ----------------------------------------------------------------------------------


def test_rank_summary():
    s = S.rank_summary({0: 1.0, 1: 2.0, 2: 3.0, 3: 12.0, 4: math.nan})
    assert s["median"] == 2.5 and s["max"] == 12.0 and s["argmax_rank"] == 3
    assert s["max_over_median"] == pytest.approx(4.8)
    assert s["n"] == 4 and s["n_nonfinite"] == 1
    z = S.rank_summary({0: 0.0, 1: 0.0, 2: 5.0})
    assert z["median"] == 0.0 and z["max_over_median"] == math.inf
    both0 = S.rank_summary({0: 0.0, 1: 0.0})
    assert math.isnan(both0["max_over_median"])
    neg = S.rank_summary({0: -1.0, 1: -2.0, 2: -3.0})
    assert math.isnan(neg["max_over_median"])
    empty = S.rank_summary({})
    assert empty["argmax_rank"] is None and math.isnan(empty["median"])
    tie = S.rank_summary({5: 2.0, 2: 2.0, 9: 1.0})
    assert tie["argmax_rank"] == 2


def test_rank_outliers():
    assert S.rank_outliers({0: 1.0, 1: 1.1, 2: 0.9, 3: 3.5}, factor=3.0) == [3]
    assert S.rank_outliers({0: 1.0, 1: 1.1, 2: 0.9, 3: 3.0}, factor=3.0) == []
    assert S.rank_outliers({0: 0.0, 1: 0.0, 2: 0.0, 3: 2.0}) == [3]  # median 0
    assert S.rank_outliers({0: 1.0, 1: 1.0, 2: math.nan, 3: math.inf}) == [2, 3]
    assert S.rank_outliers({0: -5.0, 1: -1.0, 2: -2.0}) == []
    assert S.rank_outliers({}) == []
    with pytest.raises(ValueError):
        S.rank_outliers({0: 1.0}, factor=0.0)


def test_hash_mismatch():
    assert S.hash_mismatch({0: "a", 1: "a", 2: "b", 3: "a"}) == [2]
    assert S.hash_mismatch({0: "b", 1: "a", 2: "a"}) == [1, 2]  # rank 0 is the reference
    assert S.hash_mismatch({1: "a", 2: "a", 3: "b"}) == [3]  # no rank 0: the majority
    assert S.hash_mismatch({1: "x", 2: "y"}) == [2]  # tie: the lowest rank's hash
    assert S.hash_mismatch({0: "a", 1: "b"}, reference_rank=1) == [0]
    assert S.hash_mismatch({}) == []


# ---- groups ---------------------------------------------------------------------------------


@hsettings(60)
@given(
    rows=st.lists(
        st.dictionaries(
            st.sampled_from(["math", "code", "chat"]),
            st.one_of(st.floats(-100, 100), nonfinite),
            max_size=3,
        ),
        max_size=30,
    ),
    w=st.integers(2, 8),
)
def test_group_trends_vs_scipy(rows, w):
    gt = S.GroupTrends(window=w, alpha=0.3)
    hist: dict[str, list[tuple[int, float]]] = {}
    for t, row in enumerate(rows):
        gt.update(row)
        for cat, v in row.items():
            if math.isfinite(v):
                hist.setdefault(cat, []).append((t, v))
    slopes = gt.slopes()
    assert set(slopes) == set(hist)
    for cat, pts in hist.items():
        pts = pts[-w:]
        if len(pts) < 2:
            assert math.isnan(slopes[cat])
        else:
            want = _quiet(scipy.stats.theilslopes, [v for _, v in pts], [t for t, _ in pts]).slope
            assert slopes[cat] == pytest.approx(want, rel=1e-12, abs=1e-12)
    latest = gt.latest()
    if len(latest) >= 2:
        assert gt.gap() == max(latest.values()) - min(latest.values())
    else:
        assert math.isnan(gt.gap())
    back = S.stat_from_state(json.loads(json.dumps(gt.to_state(), allow_nan=False)))
    for cat, v in gt.slopes().items():
        assert (math.isnan(v) and math.isnan(back.slopes()[cat])) or back.slopes()[cat] == v
    assert (math.isnan(gt.gap_trend()) and math.isnan(back.gap_trend())) or (
        back.gap_trend() == gt.gap_trend()
    )


def test_group_trends_widening_gap_and_category_bound():
    gt = S.GroupTrends(window=20, alpha=1.0, max_categories=2)
    for t in range(20):
        gt.update({"easy": 0.5 + 0.02 * t, "hard": 0.5 - 0.01 * t, "third": 1.0})
    assert gt.slopes() == pytest.approx({"easy": 0.02, "hard": -0.01})
    assert gt.gap() == pytest.approx(0.03 * 19)
    assert gt.gap_trend() == pytest.approx(0.03)
    assert gt.n_dropped == 20 and gt.categories == ["easy", "hard"]


# ---- series store ---------------------------------------------------------------------------


def test_series_store_lru_state_and_clear():
    made = []

    def factory(key):
        made.append(key)
        return S.RollingMean(3) if key[-1] == "mean" else S.EMA(alpha=0.5)

    store = S.SeriesStore(factory, max_keys=3)
    for _i, x in enumerate([1.0, 2.0, 3.0, 4.0]):
        store[("run1", 0, "loss", "mean")].update(x)
        store[("run1", 0, "loss", "ema")].update(x * 10)
    store[("run2", 1, "kl", "mean")].update(7.0)
    assert len(made) == 3 and len(store) == 3
    store.get(("run1", 0, "loss", "mean"))  # touch: now most recent
    store[("run3", 0, "kl", "mean")].update(1.0)  # evicts ('run1', 0, 'loss', 'ema')
    assert store.evicted == 1
    assert ("run1", 0, "loss", "ema") not in store
    assert store.keys()[-1] == ("run3", 0, "kl", "mean")
    assert store.peek(("nope",)) is None and len(store) == 3

    text = json.dumps(store.to_state(), allow_nan=False)
    back = S.SeriesStore.from_state(json.loads(text), factory)
    assert back.keys() == store.keys() and back.evicted == 1
    assert back[("run1", 0, "loss", "mean")].get() == 3.0
    assert isinstance(back.keys()[0][1], int)
    for key in store:
        assert back.peek(key).get() == store.peek(key).get()

    assert store.drop_prefix(("run1",)) == 1
    assert ("run1", 0, "loss", "mean") not in store
    store.clear()
    assert len(store) == 0
    with pytest.raises(TypeError):
        store.get(["not", "a", "tuple"])
    with pytest.raises(TypeError):
        store.get(("run", 1.5))
    with pytest.raises(ValueError):
        S.SeriesStore(factory, max_keys=0)
    with pytest.raises(ValueError):
        S.SeriesStore.from_state({"type": "Other"}, factory)
