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
    """The last ``window`` values in arrival order (deque) and sorted (list), synced lazily.

    ``update`` only appends to the deque and remembers the value that fell out (O(1), ~100 ns
    of work); the sorted copy is brought up to date when a result is asked for: each pending
    change costs one ``bisect`` + ``insort``/``del`` (a memmove), and if more than
    ``window // 4`` changes are pending the sorted copy is rebuilt with one ``sorted()``
    instead. Memory stays bounded by ``window`` (deque, sorted list, pending removals).
    """

    __slots__ = ("window", "_buf", "_sorted", "_gone", "_pending", "_cap")

    def __init__(self, window: int):
        self.window = check_int("window", window, 1)
        self.n_skipped = 0
        self._buf: deque[float] = deque(maxlen=self.window)
        self._sorted: list[float] = []
        self._gone: list[float] = []  # values that left the window since the last sync
        self._pending = 0  # values appended since the last sync (capped at _cap)
        self._cap = min(self.window, max(4, self.window // 4))

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
        p = self._pending
        if p < self._cap:
            if len(buf) == self.window:
                self._gone.append(buf[0])
            self._pending = p + 1
        buf.append(x)

    def _sync(self) -> list[float]:
        """The sorted window, brought up to date."""
        p = self._pending
        if p == 1:  # the common case: one update since the last read
            s = self._sorted
            gone = self._gone
            if gone:
                del s[bisect_left(s, gone.pop())]
            insort(s, self._buf[-1])
            self._pending = 0
            return s
        if p:
            buf = self._buf
            if p >= self._cap:
                self._sorted = sorted(buf)
            else:
                s = self._sorted
                for v in self._gone:
                    del s[bisect_left(s, v)]
                for i in range(-p, 0):
                    insort(s, buf[i])
            self._gone.clear()
            self._pending = 0
        return self._sorted

    @property
    def n(self) -> int:
        """Number of values in the window."""
        return len(self._buf)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window}

    def _dump(self) -> dict[str, Any]:
        return {"buf": list(self._buf)}

    def _load(self, state: dict[str, Any]) -> None:
        self._buf = deque(state["buf"], maxlen=self.window)
        self._sorted = sorted(self._buf)
        self._gone = []
        self._pending = 0


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
        return sorted_median(self._sync())


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
        return sorted_quantile(self._sync(), self.q)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window, "q": self.q}
