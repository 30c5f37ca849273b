"""Mean of the last ``window`` values, O(1) per update."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from ._num import EPS, RECOMPUTE_TOL, exact_mean, exact_sum
from .base import Statistic, check_int

# recompute when eps * (error bound) > RECOMPUTE_TOL * |sum|
_CHECK = RECOMPUTE_TOL / EPS

__all__ = ["RollingMean"]


class RollingMean(Statistic):
    """Arithmetic mean of the last ``window`` finite values (fewer while filling up).

    The sum is updated in O(1) (``s += x - oldest``). Alongside it an upper bound of the
    accumulated rounding error is kept (the standard bound for recursive summation,
    ``eps * sum |partial sums|``); when that bound exceeds ``1e-10`` of the current sum, the
    update recomputes the sum exactly (``math.fsum``) from the window. So a huge value that leaves the
    window (``[1e20, 1, 2, 3]`` -> ``[1, 2, 3]``) cannot poison the mean, and in ordinary data the
    O(window) recompute almost never runs. Values near the float limits (sum overflowing) are
    handled by a rescaled exact mean. ``get()`` has no side effects: the answers depend only on
    the values fed, not on when they were read.

    Examples
    --------
    >>> m = RollingMean(window=3)
    >>> for x in [1.0, 2.0, 3.0, 4.0]:
    ...     m.update(x)
    >>> m.get()
    3.0
    """

    __slots__ = ("window", "_buf", "_sum", "_err")

    def __init__(self, window: int):
        self.window = check_int("window", window, 1)
        self.n_skipped = 0
        self._buf: deque[float] = deque()
        self._sum = 0.0
        self._err = 0.0  # sum of |partial sums| since the last exact recompute

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
        if len(buf) > self.window:
            d = x - buf.popleft()
            s = self._sum + d
            err = self._err + abs(s) + abs(d)
        else:
            s = self._sum + x
            err = self._err + abs(s)
        if err > _CHECK * abs(s) or err == math.inf:
            self._recompute()
        else:
            self._sum = s
            self._err = err

    def _recompute(self) -> None:
        self._sum = s = exact_sum(self._buf)
        self._err = abs(s)  # the correctly rounded sum is still off by up to eps * |sum|

    def get(self) -> float:
        n = len(self._buf)
        if n == 0:
            return math.nan
        s = self._sum
        if s - s != 0.0:  # the true sum overflows: mean via rescaling
            return exact_mean(self._buf)
        return s / n

    @property
    def n(self) -> int:
        """Number of values in the window."""
        return len(self._buf)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window}

    def _dump(self) -> dict[str, Any]:
        return {"buf": list(self._buf), "sum": self._sum, "err": self._err}

    def _load(self, state: dict[str, Any]) -> None:
        self._buf = deque(state["buf"])
        self._sum = state["sum"]
        self._err = state["err"]
