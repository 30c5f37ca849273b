"""Exact rolling median and quantiles over a sorted copy of the window."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from typing import Any

from ._num import sorted_median, sorted_quantile
from ._window import _LazyWindow
from .base import check_float

__all__ = ["RollingMedian", "RollingQuantile"]


class _SortedWindow(_LazyWindow):
    """The last ``window`` values in arrival order (deque) and sorted (list).

    Each new value costs one ``bisect`` + ``insort``/``del`` (a memmove), done in ``update``
    while results are read every step and deferred to the next read otherwise (see
    ``_LazyWindow``); if more than ``window // 4`` values arrived since the last read the sorted
    copy is rebuilt with one ``sorted()`` instead. The sorted copy is exact either way.
    """

    __slots__ = ("_sorted",)

    def __init__(self, window: int):
        super().__init__(window)
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
        buf.append(x)
        n = len(buf)
        if self._read and n - 1 == self._synced:  # read after every update: advance now
            self._read = False
            s = self._sorted
            if n > self.window:
                del s[bisect_left(s, buf.popleft())]
                n -= 1
            insort(s, x)
            self._synced = n
        elif n > self._limit:
            self._trim()

    def _sync(self) -> list[float]:
        """The sorted window, brought up to date (every read goes through here)."""
        self._read = True
        buf = self._buf
        synced = self._synced
        n = len(buf)
        if n == synced:
            return self._sorted
        w = self.window
        s = self._sorted
        if synced < 0 or n - synced > (w >> 2):
            while len(buf) > w:
                buf.popleft()
            self._sorted = s = sorted(buf)
        else:
            size = synced
            for x in self._new_values():
                if size == w:
                    del s[bisect_left(s, buf.popleft())]
                else:
                    size += 1
                insort(s, x)
        self._synced = len(buf)
        return s

    def _dump(self) -> dict[str, Any]:
        return {"buf": list(self._buf)}

    def _load(self, state: dict[str, Any]) -> None:
        # the sorted copy is exact whichever way it is built: rebuild it
        self._buf = deque(state["buf"])
        while len(self._buf) > self.window:
            self._buf.popleft()
        self._sorted = sorted(self._buf)
        self._synced = len(self._buf)


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
