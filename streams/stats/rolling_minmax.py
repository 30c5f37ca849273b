"""Minimum and maximum of the last ``window`` values (monotonic deque, amortised O(1))."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from .base import Statistic, check_int

__all__ = ["RollingMax", "RollingMin"]


class _RollingExtremum(Statistic):
    """Monotonic deque of ``(index, value)``: the front is the window's extremum."""

    __slots__ = ("window", "_i", "_q")
    _sign = 1.0  # +1 for max, -1 for min (compare sign * value)

    def __init__(self, window: int):
        self.window = check_int("window", window, 1)
        self.n_skipped = 0
        self._i = 0  # number of finite values seen
        self._q: deque[tuple[int, float]] = deque()

    def _add(self, x: float) -> None:
        i = self._i
        q = self._q
        if self._sign > 0:
            while q and q[-1][1] <= x:
                q.pop()
        else:
            while q and q[-1][1] >= x:
                q.pop()
        q.append((i, x))
        if q[0][0] <= i - self.window:
            q.popleft()
        self._i = i + 1

    def get(self) -> float:
        q = self._q
        return q[0][1] if q else math.nan

    @property
    def n(self) -> int:
        """Number of values in the window."""
        return min(self._i, self.window)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window}

    def _dump(self) -> dict[str, Any]:
        return {"i": self._i, "q": [[i, v] for i, v in self._q]}

    def _load(self, state: dict[str, Any]) -> None:
        self._i = state["i"]
        self._q = deque((int(i), v) for i, v in state["q"])


class RollingMax(_RollingExtremum):
    """Largest of the last ``window`` finite values.

    Examples
    --------
    >>> m = RollingMax(window=2)
    >>> for x in [3.0, 1.0, 2.0]:
    ...     m.update(x)
    >>> m.get()
    2.0
    """

    __slots__ = ()
    _sign = 1.0


class RollingMin(_RollingExtremum):
    """Smallest of the last ``window`` finite values.

    Examples
    --------
    >>> m = RollingMin(window=2)
    >>> for x in [1.0, 3.0, 2.0]:
    ...     m.update(x)
    >>> m.get()
    2.0
    """

    __slots__ = ()
    _sign = -1.0
