"""z-scores of the newest value against the rolling baseline of the values before it."""

from __future__ import annotations

import math
from typing import Any

from ._num import MAD_TO_SIGMA, half_sum, scale_floor, sorted_mad, sorted_median, z_ratio
from .base import _NewestValue, as_float, check_int
from .rolling_quantile import _SortedWindow
from .rolling_var import _RollingMoments

__all__ = ["RobustZ", "ZScore"]


def _check_min_periods(min_periods: Any, window: int, lowest: int) -> int:
    if min_periods is None:
        return max(lowest, min(window, 20))
    min_periods = check_int("min_periods", min_periods, lowest)
    if min_periods > window:
        raise ValueError(f"min_periods must be <= window, got {min_periods} > {window}")
    return min_periods


class _Lagged(_NewestValue):
    """Shared mechanics of :class:`RobustZ` and :class:`ZScore` (a mixin over a
    ``_LazyWindow``): the newest value is held apart in ``_last`` and scored by ``_score``
    against the window of the values before it, which it joins when the next value arrives.
    ``get()`` is cached in ``_z`` until the next update."""

    __slots__ = ()
    _lowest_min_periods = 1

    def __init__(self, window: int, min_periods: int | None = None):
        super().__init__(window)  # type: ignore[call-arg]
        self.min_periods = _check_min_periods(min_periods, self.window, self._lowest_min_periods)
        self._last = math.nan  # newest finite value, not yet in the baseline
        self._z: float | None = None  # cached get()

    def update(self, x: float) -> None:
        # Statistic.update, then _LazyWindow._push(prev), both inlined (hot path: saves a call)
        if type(x) is not float:
            x = as_float(x)
        if x - x != 0.0:
            self.n_skipped += 1
            return
        prev = self._last
        self._last = x
        self._z = None
        if prev == prev:  # the previous newest value joins the baseline
            buf = self._buf
            buf.append(prev)
            n = len(buf)
            if self._read and n - 1 == self._synced:  # read after every update: advance now
                self._read = False
                self._synced = self._step(prev, n - 1)
            elif n > self._limit:
                self._trim()

    def get(self) -> float:
        z = self._z
        if z is None:
            z = self._z = self._score(self._last)
        return z

    def _score(self, x: float) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        return {"window": self.window, "min_periods": self.min_periods}


class RobustZ(_Lagged, _SortedWindow):
    """Robust z-score of the newest value: ``(x - median) / (1.4826 * MAD)``.

    The median and MAD are those of the ``window`` values *before* the newest one (the newest
    value is not part of its own baseline, so a spike cannot mask itself). NaN until the baseline
    holds ``min_periods`` values (default ``min(window, 20)``).

    Scale floor: the scale used is ``max(1.4826 * MAD, max(1e-12, 1e-9 * |median|))``. A flat
    baseline (MAD = 0) therefore gives large but finite z-scores for any departure: e.g. a
    baseline of exactly 2.0 and a new value 2.1 gives ``0.1 / 2e-9 = 5e7``; a repeat of 2.0
    gives 0.

    Examples
    --------
    >>> rz = RobustZ(window=5, min_periods=5)
    >>> for x in [1.0, 2.0, 3.0, 2.0, 1.0, 10.0]:
    ...     rz.update(x)
    >>> round(rz.get(), 4)  # (10 - 2) / (1.4826 * 1)
    5.3959
    """

    __slots__ = ("min_periods", "_last", "_z", "_hint")

    def __init__(self, window: int, min_periods: int | None = None):
        super().__init__(window, min_periods)
        self._hint = -1  # previous split of the MAD search: warm start only, never the answer

    @property
    def median(self) -> float:
        """Median of the baseline (NaN when empty)."""
        return sorted_median(self._sync())

    @property
    def mad(self) -> float:
        """Raw MAD of the baseline (NaN when empty)."""
        s = self._sync()
        med = sorted_median(s)
        if med != med:
            return med
        mad, self._hint = sorted_mad(s, med, self._hint)
        return mad

    def _score(self, x: float) -> float:
        s = self._sync()
        n = len(s)
        if x != x or n < self.min_periods:
            return math.nan
        h = n >> 1
        med = s[h] if n & 1 else half_sum(s[h - 1], s[h])
        mad, self._hint = sorted_mad(s, med, self._hint)
        scale = MAD_TO_SIGMA * mad
        floor = 1e-9 * abs(med)  # scale_floor(med), inlined
        if floor < 1e-12:
            floor = 1e-12
        if scale < floor:
            scale = floor
        z = (x - med) / scale
        if z - z != 0.0:
            z = z_ratio(x, med, scale)
        return z


class ZScore(_Lagged, _RollingMoments):
    """Classical z-score of the newest value: ``(x - mean) / std`` of the ``window`` values
    before it (sample std, ``ddof=1``).

    Same scale floor as :class:`RobustZ`: ``max(std, max(1e-12, 1e-9 * |mean|))``. NaN until the
    baseline holds ``min_periods`` values (default ``min(window, 20)``, at least 2).

    Examples
    --------
    >>> z = ZScore(window=4, min_periods=4)
    >>> for x in [1.0, 2.0, 3.0, 4.0, 7.0]:
    ...     z.update(x)
    >>> round(z.get(), 4)  # (7 - 2.5) / 1.290994
    3.4857
    """

    __slots__ = ("min_periods", "_last", "_z")
    _lowest_min_periods = 2

    @property
    def std(self) -> float:
        """Sample standard deviation of the baseline."""
        return self._std()

    def _score(self, x: float) -> float:
        if x != x or self.n < self.min_periods:
            return math.nan
        sd = self._std()
        mean = self._mean()
        floor = scale_floor(mean)
        if sd < floor:
            sd = floor
        return z_ratio(x, mean, sd)
