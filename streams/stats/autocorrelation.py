"""Dominant autocorrelation period over a rolling window (oscillation detection)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from ._window import _CachedWindow
from .base import check_int

__all__ = ["Autocorrelation", "acf"]


@lru_cache(maxsize=32)
def _centered_time(n: int) -> tuple[np.ndarray, float]:
    t = np.arange(n, dtype=float)
    t -= (n - 1) / 2.0
    return t, float(np.dot(t, t))


def acf(values: Any, max_lag: int, detrend: bool = True) -> np.ndarray:
    """Sample autocorrelation ``r_0 .. r_max_lag`` of ``values`` (after removing the least
    squares line when ``detrend``): ``r_k = sum_t y_t y_{t+k} / sum_t y_t^2`` (the usual biased
    estimator, as ``statsmodels.tsa.stattools.acf``). NaNs when nothing is left after detrending
    (a constant or, up to rounding, exactly linear series).
    """
    y = np.array(values, dtype=float)
    n = y.size
    out = np.full(max_lag + 1, np.nan)
    if n == 0:
        return out
    for attempt in (0, 1):
        if attempt:  # squares overflowed or underflowed: the ACF is scale-free, rescale
            scale = float(np.abs(y).max())
            if scale == 0.0:
                return out
            y = y / scale
        with np.errstate(all="ignore"):
            yc = y - y.sum() / n
            total = float(np.dot(yc, yc))
            if detrend and n >= 2:
                t, tt = _centered_time(n)
                yc = yc - t * (float(np.dot(t, yc)) / tt)
            denom = float(np.dot(yc, yc))
        if 1e-280 < total < 1e280:
            break
        if total == 0.0:
            return out
    # nothing left (constant, or exactly linear up to rounding: residual RMS < 1e-12 of the spread)
    if not denom > 1e-24 * total:
        return out
    m = min(max_lag, n - 1)
    full = np.correlate(yc, yc, mode="full")[n - 1 : n + m]
    out[: m + 1] = full / denom
    return out


class Autocorrelation(_CachedWindow):
    """Dominant autocorrelation lag and its strength over the last ``window`` values.

    On the detrended window (least-squares line removed) the ACF ``r_1 .. r_{max_lag+1}`` is
    computed; the dominant lag is the lag ``k`` in ``[2, max_lag]`` that is a local peak of the
    ACF (``r_k >= r_{k-1}`` and ``r_k >= r_{k+1}``) with the largest ``r_k``. ``get()`` returns
    that ``r_k`` (the strength, at most 1) and ``lag`` the period in steps. A series with no
    ACF peak (e.g. a smooth random walk, whose ACF only decays) gives strength 0.0 and lag 0.
    NaN (and lag 0) until the window is full, or when the detrended window is exactly linear.
    Computed lazily with numpy on ``get()`` (O(window^2) in C) and cached until the next update.

    Examples
    --------
    >>> ac = Autocorrelation(window=60, max_lag=20)
    >>> for i in range(60):
    ...     ac.update(math.sin(2 * math.pi * i / 8) + 0.01 * i)
    >>> ac.lag, round(ac.get(), 2)
    (8, 0.87)
    """

    __slots__ = ("max_lag",)

    def __init__(self, window: int, max_lag: int | None = None):
        super().__init__(window, 5)
        if max_lag is None:
            max_lag = max(2, min(self.window // 2, self.window - 2))
        self.max_lag = check_int("max_lag", max_lag, 2)
        if self.max_lag > self.window - 2:
            raise ValueError(f"max_lag must be <= window - 2, got {max_lag} (window {window})")

    def _calc(self) -> tuple[float, int]:
        if len(self._buf) < self.window:
            return (math.nan, 0)
        r = acf(self._buf, self.max_lag + 1)
        if np.isnan(r[1]):
            return (math.nan, 0)
        mid = r[2:-1]
        peaks = (mid >= r[1:-2]) & (mid >= r[3:])
        if not peaks.any():
            return (0.0, 0)
        ks = np.nonzero(peaks)[0]
        best = ks[np.argmax(mid[ks])]
        return (float(mid[best]), int(best) + 2)

    @property
    def lag(self) -> int:
        return self._compute()[1]

    def _params(self) -> dict[str, Any]:
        return {"window": self.window, "max_lag": self.max_lag}
