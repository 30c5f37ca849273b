"""Shape of one step's per-sample distribution (pure functions, numpy in, float out).

Every function ignores non-finite values (NaN, +/-Inf) and returns NaN when the quantity is
undefined (too few values, zero variance). Moment-based functions rescale by the largest
magnitude first - they are scale-free - so values near 1e300 or 1e-300 neither overflow nor
underflow.

>>> import numpy as np
>>> xs = np.array([1.0, 2.0, 2.0, 3.0, 10.0, np.nan])
>>> round(skewness(xs), 4), tail_mass(xs, above=2.5), frac_at_cap(xs, cap=10.0)
(2.0287, 0.4, 0.2)
>>> spearman([1, 2, 3, 4], [10, 20, 30, 25])
0.8
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "bimodality_coefficient",
    "finite_values",
    "frac_at_cap",
    "histogram",
    "kurtosis_excess",
    "quantiles",
    "rankdata",
    "skewness",
    "spearman",
    "tail_mass",
]

_EPS = float(np.finfo(float).eps)


def finite_values(xs: Any) -> np.ndarray:
    """The finite values of ``xs`` as a flat float array."""
    a = np.asarray(xs, dtype=float).ravel()
    return a[np.isfinite(a)]


def histogram(
    xs: Any, bins: int | Any = 10, range: tuple[float, float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.histogram`` of the finite values: ``(counts, edges)``."""
    return np.histogram(finite_values(xs), bins=bins, range=range)


def quantiles(xs: Any, qs: Any) -> Any:
    """``numpy.quantile`` (linear) of the finite values; NaN(s) when there are none."""
    a = finite_values(xs)
    q = np.asarray(qs, dtype=float)
    if np.any((q < 0) | (q > 1)) or np.any(np.isnan(q)):
        raise ValueError("quantiles must be in [0, 1]")
    if a.size == 0:
        out = np.full(q.shape, np.nan)
        return float(out) if out.ndim == 0 else out
    out = np.quantile(a, q)
    return float(out) if np.ndim(out) == 0 else out


def _central_moments(xs: Any, orders: tuple[int, ...]) -> tuple[int, list[float]] | None:
    """``(n, [m2, m_k...])`` of the finite values rescaled to max |x| = 1, or None if the
    variance is zero up to rounding (scipy's criterion: ``m2 <= (eps * mean)^2``)."""
    a = finite_values(xs)
    n = a.size
    if n == 0:
        return None
    scale = float(np.max(np.abs(a)))
    if scale == 0.0:
        return None
    y = a / scale
    mean = float(np.mean(y))
    d = y - mean
    d2 = d * d
    m2 = float(np.mean(d2))
    if m2 <= (_EPS * mean) ** 2:
        return None
    ms = [m2]
    for k in orders:
        ms.append(float(np.mean(d2 * d)) if k == 3 else float(np.mean(d2 * d2)))
    return n, ms


def skewness(xs: Any) -> float:
    """Adjusted Fisher-Pearson sample skewness ``G1`` (``scipy.stats.skew(bias=False)``).
    NaN for fewer than 3 values or zero variance."""
    r = _central_moments(xs, (3,))
    if r is None or r[0] < 3:
        return math.nan
    n, (m2, m3) = r
    g1 = m3 / m2**1.5
    return g1 * math.sqrt(n * (n - 1.0)) / (n - 2.0)


def kurtosis_excess(xs: Any) -> float:
    """Bias-corrected excess kurtosis ``G2`` (``scipy.stats.kurtosis(bias=False)``, Fisher).
    NaN for fewer than 4 values or zero variance."""
    r = _central_moments(xs, (4,))
    if r is None or r[0] < 4:
        return math.nan
    n, (m2, m4) = r
    return ((n * n - 1.0) * m4 / (m2 * m2) - 3.0 * (n - 1.0) ** 2) / ((n - 2.0) * (n - 3.0))


def bimodality_coefficient(xs: Any) -> float:
    """Sarle's bimodality coefficient (SAS):
    ``(G1^2 + 1) / (G2 + 3 (n-1)^2 / ((n-2)(n-3)))`` with the bias-corrected skewness ``G1`` and
    excess kurtosis ``G2``. Above 5/9 (~0.555, the value of a uniform distribution) suggests
    bimodality. NaN for fewer than 4 values or zero variance."""
    r = _central_moments(xs, (3, 4))
    if r is None or r[0] < 4:
        return math.nan
    n, (m2, m3, m4) = r
    g1 = m3 / m2**1.5 * math.sqrt(n * (n - 1.0)) / (n - 2.0)
    g2 = ((n * n - 1.0) * m4 / (m2 * m2) - 3.0 * (n - 1.0) ** 2) / ((n - 2.0) * (n - 3.0))
    return (g1 * g1 + 1.0) / (g2 + 3.0 * (n - 1.0) ** 2 / ((n - 2.0) * (n - 3.0)))


def tail_mass(xs: Any, above: float) -> float:
    """Fraction of the finite values strictly greater than ``above``; NaN if there are none."""
    a = finite_values(xs)
    if a.size == 0:
        return math.nan
    return float(np.count_nonzero(a > above)) / a.size


def frac_at_cap(xs: Any, cap: float, tol: float = 0.0) -> float:
    """Fraction of the finite values at (or beyond) an upper cap: ``x >= cap - tol``.

    E.g. the share of responses that hit ``max_new_tokens``. NaN if there are no values."""
    if tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    a = finite_values(xs)
    if a.size == 0:
        return math.nan
    return float(np.count_nonzero(a >= cap - tol)) / a.size


def rankdata(a: Any) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (``scipy.stats.rankdata``)."""
    arr = np.asarray(a, dtype=float).ravel()
    n = arr.size
    sorter = np.argsort(arr, kind="mergesort")
    inv = np.empty(n, dtype=np.intp)
    inv[sorter] = np.arange(n, dtype=np.intp)
    s = arr[sorter]
    obs = np.concatenate(([True], s[1:] != s[:-1]))
    dense = np.cumsum(obs)[inv]
    count = np.concatenate((np.nonzero(obs)[0], [n]))
    return 0.5 * (count[dense] + count[dense - 1] + 1)


def spearman(xs: Any, ys: Any) -> float:
    """Spearman rank correlation over the pairs where both values are finite.

    Ties get average ranks (like ``scipy.stats.spearmanr``). NaN when fewer than 3 pairs or
    when either side is constant."""
    x = np.asarray(xs, dtype=float).ravel()
    y = np.asarray(ys, dtype=float).ravel()
    if x.size != y.size:
        raise ValueError(f"xs and ys differ in length: {x.size} != {y.size}")
    keep = np.isfinite(x) & np.isfinite(y)
    if not keep.all():
        x = x[keep]
        y = y[keep]
    if x.size < 3:
        return math.nan
    rx = rankdata(x)
    ry = rankdata(y)
    rx -= rx.mean()
    ry -= ry.mean()
    sxx = float(np.dot(rx, rx))
    syy = float(np.dot(ry, ry))
    if sxx == 0.0 or syy == 0.0:
        return math.nan
    r = float(np.dot(rx, ry)) / math.sqrt(sxx * syy)
    return max(-1.0, min(1.0, r))
