"""The change detectors (Page-Hinkley, CUSUM) against straightforward reference
implementations, and their behaviour on shifts and on data in control."""

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
