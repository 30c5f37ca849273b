"""Flat-line detection: relative range of the window."""

from __future__ import annotations

import math
from typing import Any

from ._num import TINY
from .base import Statistic, check_float, check_int
from .rolling_mean import RollingMean
from .rolling_minmax import RollingMax, RollingMin

__all__ = ["Flatline"]


class Flatline(Statistic):
    """Relative range ``(max - min) / max(|mean|, 1e-12)`` of the last ``window`` values.

    ``is_flat`` is True when the window is full and the relative range is below ``rel_tol``
    (a metric that stopped moving: a stuck loss, a dead logger repeating the last value). A
    window of zeros has relative range 0 and is flat. The ``1e-12`` floor keeps the ratio finite
    for metrics whose mean is 0; metrics living entirely below ~1e-12 in magnitude would need
    rescaling before this test. Amortised O(1) per update (monotonic deques + running mean).

    Examples
    --------
    >>> fl = Flatline(window=3, rel_tol=1e-6)
    >>> for x in [5.0, 5.0, 5.0]:
    ...     fl.update(x)
    >>> fl.get(), fl.is_flat
    (0.0, True)
    >>> fl.update(6.0)
    >>> round(fl.get(), 4), fl.is_flat
    (0.1875, False)
    """

    __slots__ = ("window", "rel_tol", "_max", "_min", "_mean")

    def __init__(self, window: int, rel_tol: float = 1e-6):
        self.window = check_int("window", window, 2)
        self.rel_tol = check_float("rel_tol", rel_tol, low=0.0)
        self.n_skipped = 0
        self._max = RollingMax(self.window)
        self._min = RollingMin(self.window)
        self._mean = RollingMean(self.window)

    def update(self, x: float) -> None:
        if type(x) is not float:
            try:
                x = float(x)
            except (TypeError, ValueError, OverflowError):
                x = math.nan
        if x - x != 0.0:
            self.n_skipped += 1
            return
        self._max._push(x)
        self._min._push(x)
        self._mean.update(x)

    @property
    def n(self) -> int:
        return self._mean.n

    @property
    def range(self) -> float:
        if not self._mean.n:
            return math.nan
        return self._max.get() - self._min.get()

    def get(self) -> float:
        if not self._mean.n:
            return math.nan
        hi = self._max.get()
        lo = self._min.get()
        if hi == lo:
            return 0.0
        denom = abs(self._mean.get())
        if denom < TINY:
            denom = TINY
        r = (hi - lo) / denom
        if r - r != 0.0:  # hi - lo overflowed
            r = hi / denom - lo / denom
        return r

    @property
    def is_flat(self) -> bool:
        return self._mean.n >= self.window and self.get() < self.rel_tol

    def _params(self) -> dict[str, Any]:
        return {"window": self.window, "rel_tol": self.rel_tol}

    def _dump(self) -> dict[str, Any]:
        return {
            "max": self._max.to_state(),
            "min": self._min.to_state(),
            "mean": self._mean.to_state(),
        }

    def _load(self, state: dict[str, Any]) -> None:
        # the nested states went through _dec already; re-encode-free rebuild
        from .base import _enc

        self._max = RollingMax.from_state(_enc(state["max"]))
        self._min = RollingMin.from_state(_enc(state["min"]))
        self._mean = RollingMean.from_state(_enc(state["mean"]))
