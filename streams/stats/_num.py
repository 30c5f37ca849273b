"""Numerical helpers shared by the statistics (private).

The "exact" helpers are the slow, careful paths the fast incremental statistics fall back to:
``math.fsum`` for correctly rounded sums, and rescaling so that values near the limits of the
float range (1e300, 1e-300) neither overflow nor underflow when squared.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

EPS = 2.220446049250313e-16
NAN = math.nan
INF = math.inf
#: Relative error bound at which the incremental mean/variance recompute exactly.
RECOMPUTE_TOL = 1e-10
#: Smallest "magnitude" used as a denominator floor for relative quantities.
TINY = 1e-12
#: 1 / Phi^-1(3/4): makes the MAD a consistent estimator of a normal sigma.
MAD_TO_SIGMA = 1.4826


def is_finite(x: float) -> bool:
    return x - x == 0.0


def coerce(x: object) -> float:
    """``float(x)``; NaN for anything that is not a number (so callers skip it)."""
    try:
        return float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return NAN


def scale_floor(center: float) -> float:
    """The documented floor on a z-score's scale: ``max(1e-12, 1e-9 * |center|)``."""
    return max(1e-12, 1e-9 * abs(center))


def exact_sum(vals: Sequence[float]) -> float:
    """Correctly rounded sum; +/-inf when the true sum overflows."""
    try:
        return math.fsum(vals)
    except OverflowError:
        # ``fsum`` raises on intermediate overflow: the exact sum is beyond the float range
        # unless it cancels, which the scaled mean below handles.
        big = max(vals)
        return INF if big > 0 else -INF


def exact_mean(vals: Sequence[float]) -> float:
    """Mean of finite values, correctly rounded where possible, never overflowing."""
    n = len(vals)
    if n == 0:
        return NAN
    lo = min(vals)
    hi = max(vals)
    if lo == hi:
        return lo + 0.0  # exactly the constant (and -0.0 -> 0.0)
    try:
        s = math.fsum(vals)
        m = s / n if s - s == 0.0 else NAN
    except OverflowError:
        m = NAN
    if m != m:
        scale = max(-lo, hi)
        m = math.fsum([v / scale for v in vals]) / n * scale
    # rounding must not push the mean outside the data
    return lo if m < lo else hi if m > hi else m


def exact_std(vals: Sequence[float], ddof: int) -> float:
    """Standard deviation, accurate for values anywhere in the float range.

    Two-pass: deviations from the (correctly rounded) mean are exact or correctly rounded, and
    the error of the rounded mean only enters to second order; the deviations are divided by
    their largest magnitude before squaring, so neither 1e300 nor 1e-300 overflows or
    underflows.
    """
    n = len(vals)
    if n - ddof <= 0:
        return NAN
    m = exact_mean(vals)
    factor = 1.0
    devs = [v - m for v in vals]
    big = max(abs(d) for d in devs)
    if big == INF:  # opposite huge signs: halve first (exact for such magnitudes)
        factor = 2.0
        hm = m * 0.5
        devs = [v * 0.5 - hm for v in vals]
        big = max(abs(d) for d in devs)
    if big == 0.0:
        return 0.0
    q = math.fsum([(d / big) * (d / big) for d in devs]) / (n - ddof)
    return factor * (big * math.sqrt(q))


def z_ratio(x: float, center: float, scale: float) -> float:
    """``(x - center) / scale`` without spurious overflow of the difference."""
    d = x - center
    z = d / scale
    if z - z != 0.0:
        if d - d != 0.0:  # the difference overflowed (values near the float limits)
            z = (x * 0.5 - center * 0.5) / (scale * 0.5)
        if z != z:
            z = math.copysign(INF, d)
    return z


def half_sum(a: float, b: float) -> float:
    """(a + b) / 2 like numpy's median, without overflowing."""
    m = (a + b) * 0.5
    if m - m != 0.0:
        m = a * 0.5 + b * 0.5
    return m


def sorted_median(s: Sequence[float]) -> float:
    n = len(s)
    if n == 0:
        return NAN
    h = n >> 1
    if n & 1:
        return s[h]
    return half_sum(s[h - 1], s[h])


def sorted_quantile(s: Sequence[float], q: float) -> float:
    """numpy.quantile(..., method="linear") of an already sorted sequence (same arithmetic)."""
    n = len(s)
    if n == 0:
        return NAN
    vi = (n - 1) * q
    lo = math.floor(vi)
    g = vi - lo
    lo = int(lo)
    if g == 0.0 or lo + 1 >= n:
        return s[min(lo, n - 1)]
    a = s[lo]
    b = s[lo + 1]
    d = b - a
    if d - d != 0.0:  # overflow of b - a: interpolate without the difference
        return a * (1.0 - g) + b * g
    if g >= 0.5:
        return b - d * (1.0 - g)
    return a + d * g


def sorted_mad(s: Sequence[float], med: float, hint: int = -1) -> tuple[float, int]:
    """Median of ``|x - med|`` over sorted ``s`` (numpy's arithmetic) without sorting, and the
    split to pass as ``hint`` next time.

    The deviations are two sorted runs either side of ``med``: ``A[i] = med - s[p-1-i]`` and
    ``B[j] = s[p+j] - med``. Their median is found from the split ``(i, j)`` of the smallest
    deviations between the runs. Without a hint a binary search finds it in O(log n); with the
    previous split of a rolling window (``hint`` = its ``i``, which moves by a step or two per
    update) a few exact comparisons do. The result is exact either way.
    """
    n = len(s)
    if n == 0:
        return NAN, -1
    # p = bisect_left(s, med): med is the median, so p is at the middle unless med repeats
    p = n >> 1
    if p and s[p - 1] >= med:
        p = bisect_left(s, med, 0, p)
    elif p < n and s[p] < med:  # (only if med is not the median of s)
        p = bisect_left(s, med, p)
    la = p
    lb = n - p
    k1 = (n >> 1) + 1 if n & 1 else n >> 1  # how many of the smallest deviations to take
    if hint < 0:
        k = k1 - 1
        lo = k + 1 - lb
        if lo < 0:
            lo = 0
        hi = k1 if k1 < la else la
        while lo < hi:  # smallest i with A[i] >= B[k - i]
            i = (lo + hi) >> 1
            if med - s[p - 1 - i] < s[p + k - i] - med:
                lo = i + 1
            else:
                hi = i
        i = lo
        j = k1 - i
    else:
        i = hint
        if i > la:
            i = la
        j = k1 - i
        if j > lb:
            j = lb
            i = k1 - j
        elif j < 0:
            j = 0
            i = k1
        # make it the k1 smallest: max(taken) <= min(not taken)
        while i > 0 and j < lb and med - s[p - i] > s[p + j] - med:
            i -= 1
            j += 1
        while j > 0 and i < la and s[p + j - 1] - med > med - s[p - 1 - i]:
            i += 1
            j -= 1
    a_prev = med - s[p - i] if i > 0 else -INF
    b_prev = s[p + j - 1] - med if j > 0 else -INF
    kth = a_prev if a_prev > b_prev else b_prev
    if n & 1:
        return kth, i
    a_next = med - s[p - 1 - i] if i < la else INF
    b_next = s[p + j] - med if j < lb else INF
    nxt = a_next if a_next < b_next else b_next
    mad = (kth + nxt) * 0.5
    if mad - mad != 0.0:
        mad = kth * 0.5 + nxt * 0.5
    return mad, i


@lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.triu_indices(n, k=1)
    return i, j


def theil_sen(y: Sequence[float], x: Sequence[float] | None = None) -> float:
    """Median of the pairwise slopes (like ``scipy.stats.theilslopes``); NaN if undefined.

    ``x`` defaults to 0, 1, 2, ... Pairs with equal ``x`` are ignored. Differences that
    overflow (values near the float limits) give infinite slopes rather than warnings.
    """
    ya = np.asarray(y, dtype=float)
    n = ya.size
    if n < 2:
        return NAN
    i, j = _pairs(n)
    with np.errstate(over="ignore", invalid="ignore"):
        dy = ya[j] - ya[i]
        if x is None:
            dx = (j - i).astype(float)
        else:
            xa = np.asarray(x, dtype=float)
            dx = xa[j] - xa[i]
            keep = dx != 0
            if not keep.all():
                dx = dx[keep]
                dy = dy[keep]
            neg = dx < 0
            if neg.any():
                dx[neg] = -dx[neg]
                dy[neg] = -dy[neg]
            if dx.size == 0:
                return NAN
        slopes = dy / dx
        slopes = slopes[~np.isnan(slopes)]
        if slopes.size == 0:
            return NAN
        return float(np.median(slopes))
