"""Exact rolling median and quantiles over a sorted copy of the window."""

from __future__ import annotations

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

    def _step(self, x: float, size: int) -> int:
        s = self._sorted
        if size == self.window:
            del s[bisect_left(s, self._buf.popleft())]
        else:
            size += 1
        insort(s, x)
        return size

    def _rebuild(self) -> None:
        self._sorted = sorted(self._buf)

    def _sync(self) -> list[float]:  # type: ignore[override]
        """The sorted window, brought up to date (every read goes through here)."""
        self._read = True
        buf = self._buf
        if len(buf) != self._synced:
            if len(buf) - self._synced > (self.window >> 2):
                self._synced = -1  # many new values: one sort is cheaper than the insertions
            _LazyWindow._sync(self)
        return self._sorted

    def _dump(self) -> dict[str, Any]:
        return {"buf": list(self._buf)}

    def _load(self, state: dict[str, Any]) -> None:
        # the sorted copy is exact whichever way it is built: rebuild it
        self._buf = deque(state["buf"])
        self._synced = -1
        _LazyWindow._sync(self)


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
