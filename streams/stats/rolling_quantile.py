"""Exact rolling median and quantiles over a sorted copy of the window."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from typing import Any

from ._num import sorted_median, sorted_quantile
from .base import Statistic, check_float, check_int

__all__ = ["RollingMedian", "RollingQuantile"]


class _SortedWindow(Statistic):
    """The last ``window`` values in arrival order (deque) and sorted (list).

    ``update`` is O(log window) comparisons plus one memmove of the sorted list (``insort`` and
    ``del``), which for windows of a few hundred is a few hundred nanoseconds.
    """

    __slots__ = ("window", "_buf", "_sorted")

    def __init__(self, window: int):
        self.window = check_int("window", window, 1)
        self.n_skipped = 0
        self._buf: deque[float] = deque()
        self._sorted: list[float] = []

    def update(self, x: float) -> None:
        if type(x) is not float:
            try:
                x = float(x)
            except (TypeError, ValueError, OverflowError):
                x = math.nan
        if x - x != 0.0:
            self.n_skipped += 1
            return
        buf = self._buf
        s = self._sorted
        buf.append(x)
        insort(s, x)
        if len(buf) > self.window:
            del s[bisect_left(s, buf.popleft())]

    @property
    def n(self) -> int:
        """Number of values in the window."""
        return len(self._buf)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window}

    def _dump(self) -> dict[str, Any]:
        return {"buf": list(self._buf)}

    def _load(self, state: dict[str, Any]) -> None:
        self._buf = deque(state["buf"])
        self._sorted = sorted(self._buf)


class RollingMedian(_SortedWindow):
    """Exact median of the last ``window`` finite values (mean of the middle two if even).

    Examples
    --------
    >>> m = RollingMedian(window=3)
    >>> for x in [5.0, 1.0, 100.0, 2.0]:
    ...     m.update(x)
    >>> m.get()
    2.0
    """

    __slots__ = ()

    def get(self) -> float:
        return sorted_median(self._sorted)


class RollingQuantile(_SortedWindow):
    """Exact ``q``-quantile of the last ``window`` values, linear interpolation like
    ``numpy.quantile`` (same arithmetic, so the answers agree bit for bit in ordinary ranges).

    Examples
    --------
    >>> rq = RollingQuantile(window=5, q=0.9)
    >>> for x in [1.0, 2.0, 3.0, 4.0, 5.0]:
    ...     rq.update(x)
    >>> rq.get()
    4.6
    """

    __slots__ = ("q",)

    def __init__(self, window: int, q: float):
        super().__init__(window)
        self.q = check_float("q", q, low=0.0, high=1.0)

    def get(self) -> float:
        return sorted_quantile(self._sorted, self.q)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window, "q": self.q}
