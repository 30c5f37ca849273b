"""Each rolling statistic against an exact or an independent reference, on random and
adversarial data (non-finite values, constant runs, offsets with tiny noise, 1e300, 1e-300,
subnormals, spikes that leave the window).

Tolerances and where exactness is not possible:

* mean: relative 1e-9 of the exact (Fraction) mean; the running sum is rechecked against a
  rounding-error bound, so a huge value leaving the window cannot poison it.
* variance / std: relative 1e-8 of the exact value (guarantee ~1e-10 + final rounding). A variance
  beyond the float range is ``inf`` (as numpy); the std stays accurate (rescaled path).
* median / quantile / MAD / robust z: bit-identical to numpy's arithmetic where numpy does not
  overflow; against the exact value, relative 1e-12 (the quantile's lerp, like numpy's, rounds
  relative to the two neighbours, hence an extra 1e-15 of the window's magnitude). Deviations
  ``|x - median|`` that exceed the float range saturate to inf, so those checks use values up
  to 1e307.
* EMA: 1e-9 of the window's magnitude (the recursion rounds at every step).
* z-score: relative 1e-7 plus the error of the mean (1e-9 of the magnitude) over the scale.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
from _stats_helpers import (
    INF,
    NAN,
    F,
    close,
    exact_mean,
    exact_var,
    finite,
    finite_only,
    hsettings,
    nonfinite,
    series,
    sqrt_fraction,
    to_float,
)
from hypothesis import assume, given
from hypothesis import strategies as st

import streams.stats as S

TINY_ABS = 1e-310  # absolute slack for results in the subnormal range

windows = st.integers(1, 12)


def _quiet(fn, *args, **kwargs):
    """Call a reference (numpy/scipy) with its warnings silenced (pytest turns them into errors)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def run(stat, data, check):
    """Feed ``data``; after each update call ``check(stat, window_of_finite_values_so_far)``."""
    seen: list[float] = []
    for x in data:
        stat.update(x)
        if isinstance(x, float) and math.isfinite(x):
            seen.append(x)
        check(stat, seen)
    assert stat.n_skipped == len(data) - len(seen)


# ---- means and spreads ----------------------------------------------------------------------


@hsettings(150)
@given(data=series(), w=windows)
def test_rolling_mean_vs_exact(data, w):
    def check(stat, seen):
        win = seen[-w:]
        if not win:
            assert math.isnan(stat.get())
            return
        want = to_float(exact_mean(win))
        got = stat.get()
        assert close(got, want, 1e-9, TINY_ABS), (win, got, want)
        if all(abs(v) < 1e300 for v in win):
            assert close(got, float(np.mean(win)), 1e-9, 1e-9 * max(abs(v) for v in win))

    run(S.RollingMean(w), data, check)


def test_rolling_mean_recovers_from_a_huge_value_leaving():
    m = S.RollingMean(3)
    for x in [1e20, 1.0, 2.0, 3.0]:
        m.update(x)
    assert m.get() == 2.0
    m = S.RollingMean(2)
    for x in [1.7e308, 1.7e308, 1.0]:
        m.update(x)
    assert m.get() == pytest.approx(0.85e308, rel=1e-15)


@hsettings(150)
@given(data=series(), w=st.integers(2, 12))
def test_rolling_var_and_std_vs_exact(data, w):
    var = S.RollingVar(w)
    std = S.RollingStd(w)
    seen: list[float] = []
    for x in data:
        var.update(x)
        std.update(x)
        if math.isfinite(x):
            seen.append(x)
        win = seen[-w:]
        if len(win) < 2:
            assert math.isnan(var.get()) and math.isnan(std.get())
            continue
        ev = exact_var(win)
        want_var = to_float(ev)
        assert close(var.get(), want_var, 1e-8, TINY_ABS), (win, var.get(), want_var)
        want_sd = sqrt_fraction(ev)
        assert close(std.get(), want_sd, 1e-8, TINY_ABS), (win, std.get(), want_sd)
        assert close(std.mean, to_float(exact_mean(win)), 1e-9, TINY_ABS + 1e-9 * want_sd)
        if all(abs(v) < 1e150 for v in win) and want_var > 1e-280:
            np_var = float(np.var(win, ddof=1))
            assert close(var.get(), np_var, 1e-6, 1e-12 * max(v * v for v in win))


def test_rolling_var_offset_noise_and_spike():
    v = S.RollingVar(4)
    for x in [1e8 + 1, 1e8 + 2, 1e8 + 3, 1e8 + 4]:
        v.update(x)
    assert v.get() == pytest.approx(5 / 3, rel=1e-12)
    for x in [1e20, 1.0, 2.0, 3.0, 4.0]:
        v.update(x)
    assert v.get() == pytest.approx(5 / 3, rel=1e-12)
    s = S.RollingStd(3)
    for x in [1e300, -1e300, 1e300]:
        s.update(x)
    assert math.isfinite(s.get()) and s.get() == pytest.approx(2e300 / math.sqrt(3), rel=1e-12)
    v = S.RollingVar(3)
    for x in [1e300, -1e300, 1e300]:
        v.update(x)
    assert v.get() == INF  # the true variance (~1.3e600) is beyond the float range
    s = S.RollingStd(3)
    for x in [1e-300, 3e-300, 2e-300]:
        s.update(x)
    assert s.get() == pytest.approx(1e-300, rel=1e-12)  # squares would underflow
    s = S.RollingStd(5)
    for x in [7.0] * 5:
        s.update(x)
    assert s.get() == 0.0 and s.mean == 7.0


@hsettings(100)
@given(data=series(), w=st.integers(1, 10))
def test_rolling_min_max_exact(data, w):
    mn, mx = S.RollingMin(w), S.RollingMax(w)

    def check(stat, seen):
        win = seen[-w:]
        if not win:
            assert math.isnan(mn.get()) and math.isnan(mx.get())
        else:
            assert mn.get() == min(win) and mx.get() == max(win)

    seen: list[float] = []
    for x in data:
        mn.update(x)
        mx.update(x)
        if math.isfinite(x):
            seen.append(x)
        check(None, seen)


@hsettings(120)
@given(data=series(), alpha=st.sampled_from([1.0, 0.5, 0.1, 0.01, 1e-4]))
def test_ema_vs_exact_weighted_mean(data, alpha):
    ema = S.EMA(alpha=alpha)
    a = Fraction(alpha)
    om = Fraction(1.0 - alpha)  # the float 1 - alpha the recursion uses

    def check(stat, seen):
        if not seen:
            assert math.isnan(stat.get())
            return
        t = len(seen)
        ws = [om ** (t - 1 - i) for i in range(t)]
        want = to_float(
            sum((w * F(x) for w, x in zip(ws, seen, strict=False)), Fraction(0)) / sum(ws)
        )
        mag = max(abs(x) for x in seen)
        assert close(stat.get(), want, 0.0, 1e-9 * mag + TINY_ABS), (seen, stat.get(), want)

    del a
    run(ema, data, check)


def test_ema_span_and_bias_correction():
    e = S.EMA(span=3)  # alpha = 0.5
    assert e.alpha == 0.5
    e.update(4.0)
    assert e.get() == 4.0  # first value returned as is (bias corrected)
    e.update(1.0)
    assert e.get() == pytest.approx((0.5 * 4 + 1 * 1) / 1.5)
    c = S.EMA(alpha=0.01)
    for _ in range(1000):
        c.update(3.3)
    assert c.get() == 3.3


# ---- order statistics -----------------------------------------------------------------------


def _exact_quantile(win, q):
    s = sorted(win)
    vi = (len(s) - 1) * q
    lo = math.floor(vi)
    g = Fraction(vi) - lo
    if lo + 1 >= len(s):
        return s[-1]
    return to_float(F(s[lo]) + (F(s[lo + 1]) - F(s[lo])) * g)


@hsettings(150)
@given(data=series(), w=windows, q=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 0.99, 1.0]))
def test_rolling_median_and_quantile(data, w, q):
    med = S.RollingMedian(w)
    rq = S.RollingQuantile(w, q)
    seen: list[float] = []
    for i, x in enumerate(data):
        med.update(x)
        rq.update(x)
        if math.isfinite(x):
            seen.append(x)
        if i % 3 == 1:
            continue  # skip some reads: the lazy sorted copy must catch up over several updates
        win = seen[-w:]
        if not win:
            assert math.isnan(med.get()) and math.isnan(rq.get())
            continue
        assert close(med.get(), _exact_quantile(win, 0.5), 1e-15, TINY_ABS)
        # numpy's lerp (b - (b - a)(1 - g)) rounds relative to the operands, not the result
        mag = max(abs(v) for v in win)
        assert close(rq.get(), _exact_quantile(win, q), 1e-12, TINY_ABS + 1e-15 * mag)
        if all(abs(v) < 1e300 for v in win):  # numpy overflows beyond; same arithmetic below
            assert med.get() == float(np.median(win))
            assert rq.get() == float(np.quantile(win, q))


def _np_mad(win):
    a = np.asarray(win)
    return float(np.median(np.abs(a - np.median(a))))


moderate_series = series(
    values=st.one_of(
        st.floats(-1e307, 1e307, allow_nan=False, allow_infinity=False),
        st.sampled_from([0.0, 1.0, 2.0, 2.0, 1e-300, 5e-324, 1e300, -1e300]),
        st.integers(-3, 3).map(float),
        nonfinite,
    )
)


@hsettings(200)
@given(data=moderate_series, w=windows, skip=st.integers(1, 4))
def test_rolling_mad_is_numpys(data, w, skip):
    mad = S.RollingMAD(w)
    scaled = S.RollingMAD(w, scaled=True)
    seen: list[float] = []
    for i, x in enumerate(data):
        mad.update(x)
        scaled.update(x)
        if math.isfinite(x):
            seen.append(x)
        if i % skip:
            continue
        win = seen[-w:]
        if not win:
            assert math.isnan(mad.get())
            continue
        want = _quiet(_np_mad, win)
        assert mad.get() == want, (win, mad.get(), want)
        # a fresh copy (no warm-start hint) agrees as well
        assert S.RollingMAD.from_state(mad.to_state()).get() == want
        assert scaled.get() == pytest.approx(1.4826 * want, rel=1e-15, abs=TINY_ABS)


def test_mad_binary_search_and_warm_start_agree_exhaustively():
    from streams.stats._num import sorted_mad, sorted_median

    rnd = np.random.default_rng(5)
    for n in range(1, 40):
        for _ in range(30):
            a = np.round(rnd.normal(size=n) * 3)  # many ties
            s = sorted(a.tolist())
            m = sorted_median(s)
            want = _np_mad(s)
            assert sorted_mad(s, m)[0] == want
            for hint in range(n + 2):  # any warm start gives the exact answer
                assert sorted_mad(s, m, hint)[0] == want, (s, hint)


def _robust_z_ref(baseline, x, min_periods):
    if len(baseline) < min_periods:
        return NAN
    a = np.asarray(baseline)
    med = float(np.median(a))
    mad = float(np.median(np.abs(a - med)))
    scale = max(1.4826 * mad, max(1e-12, 1e-9 * abs(med)))
    return (x - med) / scale


@hsettings(150)
@given(data=moderate_series, w=st.integers(1, 10), mp=st.integers(1, 10))
def test_robust_z_vs_numpy(data, w, mp):
    mp = min(mp, w)
    rz = S.RobustZ(w, min_periods=mp)
    seen: list[float] = []
    for x in data:
        rz.update(x)
        if math.isfinite(x):
            seen.append(x)
        if not seen:
            assert math.isnan(rz.get())
            continue
        want = _quiet(_robust_z_ref, seen[-(w + 1) : -1], seen[-1], mp)
        got = rz.get()
        if math.isinf(want) or abs(want) > 1e300:
            assert got == want or close(got, want, 1e-12)
        else:
            assert close(got, want, 1e-12, 1e-300), (seen[-(w + 1) :], got, want)


def test_robust_z_scale_floor_and_self_exclusion():
    rz = S.RobustZ(window=5, min_periods=5)
    for x in [2.0] * 5:
        rz.update(x)
    assert math.isnan(rz.get())  # the baseline excludes the newest value: only 4 so far
    rz.update(2.1)
    assert rz.get() == pytest.approx(0.1 / 2e-9, rel=1e-6)  # floor = 1e-9 * |median|
    rz.update(2.0)  # 2.1 is now in the baseline; median and MAD still 2.0 and 0
    assert rz.get() == 0.0
    z0 = S.RobustZ(window=3, min_periods=3)
    for x in [0.0, 0.0, 0.0, 1e-13]:
        z0.update(x)
    assert z0.get() == pytest.approx(0.1)  # floor 1e-12 when the median is 0


@hsettings(120)
@given(data=series(), w=st.integers(2, 10), mp=st.integers(2, 10))
def test_zscore_vs_exact(data, w, mp):
    mp = min(mp, w)
    z = S.ZScore(w, min_periods=mp)
    seen: list[float] = []
    for x in data:
        z.update(x)
        if math.isfinite(x):
            seen.append(x)
        base = seen[-(w + 1) : -1]
        if len(base) < mp:
            assert math.isnan(z.get())
            continue
        mean = exact_mean(base)
        sd = sqrt_fraction(exact_var(base))
        fmean = to_float(mean)
        scale = max(sd, max(1e-12, 1e-9 * abs(fmean)))
        want = to_float((F(seen[-1]) - mean) / F(scale))
        mag = max(abs(v) for v in base + [seen[-1]])
        assert close(z.get(), want, 1e-7, 1e-9 * mag / scale + 1e-9), (
            base,
            seen[-1],
            z.get(),
            want,
        )


@hsettings(60)
@given(data=series(), warmup=st.integers(1, 8))
def test_warmup_baseline(data, warmup):
    wb = S.WarmupBaseline(warmup)
    for x in data:
        wb.update(x)
    first = finite_only(data)[:warmup]
    if len(first) < warmup:
        assert not wb.frozen and math.isnan(wb.get()) and math.isnan(wb.median)
        return
    assert wb.frozen
    assert close(wb.mean, to_float(exact_mean(first)), 1e-12, TINY_ABS)
    assert wb.get() == wb.mean
    assert close(wb.median, _exact_quantile(first, 0.5), 1e-15, TINY_ABS)
    if warmup >= 2:
        assert close(wb.std, sqrt_fraction(exact_var(first)), 1e-9, TINY_ABS)
    else:
        assert math.isnan(wb.std)
    assert wb.n_after == len(finite_only(data)) - warmup


# ---- DDSketch -------------------------------------------------------------------------------


sketch_values = st.lists(st.one_of(finite, nonfinite), max_size=200)


@hsettings(100)
@given(data=sketch_values, acc=st.sampled_from([0.01, 0.05, 0.001]))
def test_ddsketch_quantiles_within_relative_accuracy(data, acc):
    sk = S.DDSketch(relative_accuracy=acc)
    for x in data:
        sk.update(x)
    xs = sorted(finite_only(data))
    assert sk.count == len(xs)
    assert sk.n_skipped == len(data) - len(xs)
    if not xs:
        assert math.isnan(sk.quantile(0.5))
        return
    for q in [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0]:
        want = float(np.quantile(xs, q, method="lower"))
        got = sk.quantile(q)
        assert abs(got - want) <= acc * abs(want) * (1 + 1e-9), (q, got, want)
    assert sk.quantile(0.0) == xs[0] and sk.quantile(1.0) == xs[-1]


@hsettings(100)
@given(a=sketch_values, b=sketch_values)
def test_ddsketch_merge_equals_sketch_of_concatenation(a, b):
    sa, sb, sab = S.DDSketch(0.02), S.DDSketch(0.02), S.DDSketch(0.02)
    for x in a:
        sa.update(x)
        sab.update(x)
    for x in b:
        sb.update(x)
        sab.update(x)
    sa.merge(sb)
    assert sa.to_state() == sab.to_state()
    for q in (0.0, 0.3, 0.5, 0.95, 1.0):
        assert (math.isnan(sa.quantile(q)) and math.isnan(sab.quantile(q))) or sa.quantile(
            q
        ) == sab.quantile(q)


def test_ddsketch_merge_with_collapsed_stores_keeps_high_quantiles():
    rnd = np.random.default_rng(0)
    a = rnd.lognormal(0, 6, 3000)
    b = -rnd.lognormal(0, 6, 1000)
    # 1000 buckets of 2% width span a factor e^20: values far below the top get collapsed
    sa, sb = S.DDSketch(0.01, max_bins=1000), S.DDSketch(0.01, max_bins=1000)
    for x in a:
        sa.update(float(x))
    for x in b:
        sb.update(float(x))
    assert sa._pos_floor is not None  # collapsing happened
    sa.merge(sb)
    assert sa.count == 4000 and len(sa._pos) <= 1000 and len(sa._neg) <= 1000
    allv = np.concatenate([a, b])
    for q in (0.0, 0.001, 0.9, 0.99, 0.999, 1.0):
        want = float(np.quantile(allv, q, method="lower"))
        assert abs(sa.quantile(q) - want) <= 0.01 * abs(want) * (1 + 1e-9)
    with pytest.raises(ValueError):
        sa.merge(S.DDSketch(0.05))
    with pytest.raises(TypeError):
        sa.merge(S.RollingMean(3))
    with pytest.raises(ValueError):
        sa.quantile(1.5)


# ---- trend: Mann-Kendall, Theil-Sen ---------------------------------------------------------


trend_values = st.one_of(
    st.integers(-4, 4).map(float),  # ties
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    nonfinite,
)


@hsettings(150)
@given(data=st.lists(trend_values, max_size=40), w=st.integers(3, 15))
def test_mann_kendall_vs_scipy(data, w):
    mk = S.MannKendall(w)
    mk_nc = S.MannKendall(w, continuity=False)
    seen: list[float] = []
    for x in data:
        mk.update(x)
        mk_nc.update(x)
        if math.isfinite(x):
            seen.append(x)
        win = seen[-w:]
        n = len(win)
        s_ref = sum(
            (win[j] > win[i]) - (win[j] < win[i]) for i in range(n) for j in range(i + 1, n)
        )
        assert mk.s == s_ref
        if n < 3 or len(set(win)) == 1:
            assert math.isnan(mk.z) and math.isnan(mk.tau) and math.isnan(mk.p_value)
            continue
        t = np.arange(n)
        kt = _quiet(scipy.stats.kendalltau, t, win)
        assert mk.tau == pytest.approx(kt.statistic, rel=1e-9, abs=1e-12)
        kta = _quiet(scipy.stats.kendalltau, t, win, method="asymptotic")
        assert mk_nc.p_value == pytest.approx(kta.pvalue, rel=1e-6, abs=1e-12)
        # the continuity-corrected z and its p-value, from the textbook formula
        _, counts = np.unique(win, return_counts=True)
        var = (n * (n - 1) * (2 * n + 5) - sum(c * (c - 1) * (2 * c + 5) for c in counts)) / 18
        z = (s_ref - np.sign(s_ref)) / math.sqrt(var)
        assert mk.z == pytest.approx(z, rel=1e-12, abs=1e-15)
        assert mk.get() == mk.z
        assert mk.p_value == pytest.approx(2 * scipy.stats.norm.sf(abs(z)), rel=1e-9, abs=1e-15)
        ts = _quiet(scipy.stats.theilslopes, win)
        assert mk.slope == pytest.approx(ts.slope, rel=1e-12, abs=1e-12)


def test_mann_kendall_detects_trend_and_not_noise():
    rnd = np.random.default_rng(1)
    up = S.MannKendall(50)
    flat = S.MannKendall(50)
    for i in range(200):
        up.update(0.01 * i + rnd.normal(0, 0.1))
        flat.update(rnd.normal(0, 0.1))
    assert up.z > 3 and up.p_value < 1e-3 and up.slope == pytest.approx(0.01, rel=0.5)
    assert abs(flat.z) < 3.5 and flat.p_value > 1e-4


@hsettings(100)
@given(
    y=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=30),
    dup=st.booleans(),
)
def test_theil_sen_vs_scipy(y, dup):
    x = [float(i // 2 if dup else i) for i in range(len(y))]
    got = S.theil_sen(y, x)
    if len(set(x)) < 2:
        assert math.isnan(got)
        return
    want = _quiet(scipy.stats.theilslopes, y, x).slope
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


# ---- change detectors -----------------------------------------------------------------------


def _page_hinkley_ref(xs, delta, threshold, direction, min_instances):
    """Straightforward re-implementation: indices of the alarms."""
    alarms = []
    n, mean, up, up_min, dn, dn_max = 0, 0.0, 0.0, 0.0, 0.0, 0.0
    for i, x in enumerate(xs):
        n += 1
        mean += (x - mean) / n
        dev = x - mean
        up += dev - delta
        up_min = min(up_min, up)
        dn += dev + delta
        dn_max = max(dn_max, dn)
        hit_up = direction in ("both", "up") and up - up_min > threshold
        hit_dn = direction in ("both", "down") and dn_max - dn > threshold
        if (hit_up or hit_dn) and n >= min_instances:
            alarms.append(i)
            n, mean, up, up_min, dn, dn_max = 0, 0.0, 0.0, 0.0, 0.0, 0.0
    return alarms


@hsettings(60)
@given(
    seed=st.integers(0, 2**32 - 1),
    direction=st.sampled_from(["both", "up", "down"]),
    shift=st.sampled_from([-3.0, -1.0, 0.0, 1.0, 3.0]),
)
def test_page_hinkley_vs_reference(seed, direction, shift):
    rnd = np.random.default_rng(seed)
    xs = np.concatenate([rnd.normal(0, 1, 150), rnd.normal(shift, 1, 150)]).tolist()
    ph = S.PageHinkley(delta=0.05, threshold=15.0, direction=direction, min_instances=10)
    got = []
    for i, x in enumerate(xs):
        ph.update(x)
        assert ph.get() == (1.0 if ph.detected else 0.0)
        if ph.detected:
            got.append(i)
    assert got == _page_hinkley_ref(xs, 0.05, 15.0, direction, 10)
    assert ph.change_count == len(got)


def test_page_hinkley_behaviour():
    ph = S.PageHinkley(delta=0.005, threshold=10.0, min_instances=5)
    for _ in range(500):
        ph.update(1.0)
    assert ph.change_count == 0
    hits = []
    for i in range(100):
        ph.update(3.0)
        if ph.detected:
            hits.append(i)
            assert ph.last_direction == 1
    assert hits and hits[0] < 10
    down_only = S.PageHinkley(delta=0.005, threshold=10.0, direction="down", min_instances=5)
    for x in [0.0] * 100 + [5.0] * 100:
        down_only.update(x)
    assert down_only.change_count == 0
    for x in [-5.0] * 100:
        down_only.update(x)
    assert down_only.change_count >= 1 and down_only.last_direction == -1


def _cusum_ref(xs, k, h, warmup):
    alarms = []
    buf: list[float] = []
    hi = lo = 0.0
    mu = sd = None
    for i, x in enumerate(xs):
        if mu is None:
            buf.append(x)
            if len(buf) == warmup:
                mu = float(np.mean(buf))
                sd = max(float(np.std(buf, ddof=1)), max(1e-12, 1e-9 * abs(mu)))
            continue
        z = (x - mu) / sd
        hi = max(0.0, hi + z - k)
        lo = max(0.0, lo - z - k)
        if hi > h or lo > h:
            alarms.append(i)
            buf, hi, lo, mu, sd = [], 0.0, 0.0, None, None
    return alarms


@hsettings(60)
@given(seed=st.integers(0, 2**32 - 1), shift=st.sampled_from([-2.0, 0.0, 0.5, 2.0]))
def test_cusum_vs_reference(seed, shift):
    rnd = np.random.default_rng(seed)
    xs = np.concatenate([rnd.normal(5, 1, 100), rnd.normal(5 + shift, 1, 100)]).tolist()
    cs = S.Cusum(k=0.5, h=4.0, warmup=20)
    got = []
    for i, x in enumerate(xs):
        cs.update(x)
        if cs.detected:
            got.append(i)
    want = _cusum_ref(xs, 0.5, 4.0, 20)
    assert got == want
    assert cs.change_count == len(got)


def test_cusum_detects_a_one_sigma_shift_fast_and_is_quiet_in_control():
    rnd = np.random.default_rng(2)
    cs = S.Cusum(k=0.5, h=5.0, warmup=50)
    for x in rnd.normal(0, 1, 50):
        cs.update(float(x))
    first = None
    for i, x in enumerate(rnd.normal(1.0, 1, 100)):
        cs.update(float(x))
        if cs.detected and first is None:
            first = i
            assert cs.last_direction == 1
    assert first is not None and first < 40  # ARL for a 1-sigma shift with k=0.5, h=5 is ~10
    quiet = S.Cusum(k=0.5, h=5.0, warmup=50)
    for x in rnd.normal(0, 1, 300):
        quiet.update(float(x))
    assert quiet.change_count <= 1  # in-control ARL ~465


# ---- relative moves, flat lines, oscillation -------------------------------------------------


@hsettings(100)
@given(data=moderate_series, w=st.integers(1, 10))
def test_relative_drop_and_rise(data, w):
    rd, rr = S.RelativeDrop(w), S.RelativeRise(w)
    seen: list[float] = []
    for x in data:
        rd.update(x)
        rr.update(x)
        if math.isfinite(x):
            seen.append(x)
        win = seen[-w:]
        if not win:
            assert math.isnan(rd.get()) and math.isnan(rr.get())
            continue
        peak, trough, last = max(win), min(win), win[-1]
        want_d = NAN if peak == 0 else to_float((F(peak) - F(last)) / abs(F(peak)))
        want_r = NAN if trough == 0 else to_float((F(last) - F(trough)) / abs(F(trough)))
        assert close(rd.get(), want_d, 1e-12, 1e-300), (win, rd.get(), want_d)
        assert close(rr.get(), want_r, 1e-12, 1e-300), (win, rr.get(), want_r)
        assert rd.get() >= 0 or math.isnan(rd.get())


@hsettings(100)
@given(data=series(), w=st.integers(2, 10), tol=st.sampled_from([0.0, 1e-9, 1e-3]))
def test_flatline(data, w, tol):
    fl = S.Flatline(w, rel_tol=tol)
    seen: list[float] = []
    for x in data:
        fl.update(x)
        if math.isfinite(x):
            seen.append(x)
        win = seen[-w:]
        if not win:
            assert math.isnan(fl.get()) and not fl.is_flat
            continue
        hi, lo = max(win), min(win)
        if hi == lo:
            want = 0.0
        else:
            mean = exact_mean(win)
            denom = max(abs(mean), Fraction(1e-12))
            # the denominator is computed to 1e-9 relative; the ratio follows
            want = to_float((F(hi) - F(lo)) / denom)
        assert close(fl.get(), want, 1e-8, TINY_ABS), (win, fl.get(), want)
        assert fl.is_flat == (len(win) == w and fl.get() < tol)


def _acf_ref(y, nlags):
    y = np.asarray(y, dtype=float)
    t = np.arange(len(y), dtype=float)
    slope, icpt = np.polyfit(t, y, 1)
    r = y - (slope * t + icpt)
    r = r - r.mean()
    d = float(np.dot(r, r))
    return np.array([np.dot(r[: len(r) - k], r[k:]) / d for k in range(nlags + 1)])


@hsettings(60)
@given(
    y=st.lists(st.floats(-100, 100, allow_nan=False), min_size=10, max_size=40),
    max_lag=st.integers(2, 8),
)
def test_acf_vs_reference(y, max_lag):
    got = S.acf(y, max_lag)
    ref = _quiet(_acf_ref, y, max_lag)
    if not np.all(np.isfinite(ref)) or np.ptp(y) < 1e-6:
        return
    assume(float(np.dot(*(2 * [np.asarray(y) - np.mean(y)]))) > 1e-6)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("period", [2, 3, 5, 8, 13])
def test_autocorrelation_finds_the_period(period):
    ac = S.Autocorrelation(window=120, max_lag=30)
    rnd = np.random.default_rng(period)
    for i in range(119):
        ac.update(math.cos(2 * math.pi * i / period) + 0.02 * i + rnd.normal(0, 0.1))
        assert math.isnan(ac.get()) and ac.lag == 0
    ac.update(math.cos(2 * math.pi * 119 / period) + 0.02 * 119)
    assert ac.lag % period == 0 and ac.lag > 0  # a multiple of the period is also a peak
    assert ac.lag == period or ac.get() > 0.5
    assert ac.get() > 0.5


def test_autocorrelation_random_walk_and_linear():
    rnd = np.random.default_rng(0)
    ac = S.Autocorrelation(window=100, max_lag=20)
    x = 0.0
    for _ in range(100):
        x += rnd.normal()
        ac.update(x)
    assert ac.get() < 0.5
    lin = S.Autocorrelation(window=10, max_lag=3)
    for i in range(10):
        lin.update(2.0 * i + 1.0)
    assert math.isnan(lin.get()) and lin.lag == 0  # nothing left after detrending


def _sign_flip_ref(win):
    d = [b - a for a, b in zip(win, win[1:], strict=False)]
    pairs = [(a, b) for a, b in zip(d, d[1:], strict=False) if a != 0 and b != 0]
    rate = sum((a > 0) != (b > 0) for a, b in pairs) / len(pairs) if pairs else NAN
    return rate


@hsettings(100)
@given(
    data=st.lists(
        st.one_of(st.integers(-3, 3).map(float), st.floats(-1e3, 1e3), nonfinite), max_size=40
    ),
    w=st.integers(3, 12),
)
def test_sign_flip_rate(data, w):
    sf = S.SignFlipRate(w)
    seen: list[float] = []
    for x in data:
        sf.update(x)
        if math.isfinite(x):
            seen.append(x)
        win = seen[-w:]
        want = _sign_flip_ref(win) if len(win) >= 2 else NAN
        assert close(sf.get(), want, 1e-12)
        if len(win) >= 2:
            a = np.asarray(win)
            mag = np.max(np.abs(a))
            if mag > 0:
                a = a / mag  # the ratio is scale-free; numpy's squares would underflow
                mag = 1.0
                ratio = np.std(np.diff(a)) / (np.std(a) + 1e-12 * mag)
                assert sf.diff_std_ratio == pytest.approx(ratio, rel=1e-9, abs=1e-12)


def test_sign_flip_rate_oscillation_vs_noise_vs_trend():
    rnd = np.random.default_rng(3)
    osc, noise, trend = S.SignFlipRate(100), S.SignFlipRate(100), S.SignFlipRate(100)
    for i in range(100):
        osc.update((-1.0) ** i + rnd.normal(0, 0.05))
        noise.update(rnd.normal())
        trend.update(i + rnd.normal(0, 0.01))
    assert osc.get() > 0.95 and osc.diff_std_ratio > 1.9
    assert 0.5 < noise.get() < 0.8 and 1.2 < noise.diff_std_ratio < 1.6
    assert trend.get() < 0.05 and trend.diff_std_ratio < 0.1


@hsettings(80)
@given(
    pairs=st.lists(
        st.tuples(
            st.one_of(st.integers(-3, 3).map(float), st.floats(-1e3, 1e3), nonfinite),
            st.one_of(st.integers(-3, 3).map(float), st.floats(-1e3, 1e3)),
        ),
        max_size=30,
    ),
    w=st.integers(3, 10),
)
def test_rolling_correlation_vs_scipy(pairs, w):
    rc = S.RollingCorrelation(w)
    kept: list[tuple[float, float]] = []
    for x, y in pairs:
        rc.update_pair(x, y)
        if math.isfinite(x) and math.isfinite(y):
            kept.append((x, y))
        win = kept[-w:]
        if len(win) < 3 or len({a for a, _ in win}) == 1 or len({b for _, b in win}) == 1:
            assert math.isnan(rc.get())
            continue
        want = _quiet(scipy.stats.spearmanr, [a for a, _ in win], [b for _, b in win]).statistic
        assert rc.get() == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    "make",
    [
        lambda: S.RollingMean(6),
        lambda: S.RollingVar(6),
        lambda: S.RollingStd(6),
        lambda: S.ZScore(6, min_periods=3),
        lambda: S.Flatline(6, rel_tol=1e-3),
        lambda: S.RollingMedian(6),
        lambda: S.RollingQuantile(6, 0.3),
        lambda: S.RollingMAD(6),
        lambda: S.RobustZ(6, min_periods=3),
    ],
)
@hsettings(40)
@given(data=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=60), gap=st.integers(1, 40))
def test_long_gaps_between_reads_stay_bounded_and_correct(make, data, gap):
    """More than ``window`` updates between reads: memory stays bounded (at most 2 x window
    values) and the rebuilt answer agrees with reading after every update."""
    eager, lazy = make(), make()
    for i, x in enumerate(data):
        eager.update(x)
        lazy.update(x)
        want = eager.get()
        assert len(lazy._buf) <= 2 * lazy.window + 1
        if i % gap == 0 or i == len(data) - 1:
            got = lazy.get()
            mag = max(abs(v) for v in data[max(0, i - 7) : i + 1])
            assert close(got, want, 1e-9, 1e-9 * mag + 1e-300), (got, want)
