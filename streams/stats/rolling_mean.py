"""Mean of the last ``window`` values, O(1) per update."""

from __future__ import annotations

import math
from typing import Any

from ._num import EPS, INF, RECOMPUTE_TOL, exact_mean, exact_sum
from ._window import _LazyWindow

__all__ = ["RollingMean"]

# recompute when eps * (error bound) > RECOMPUTE_TOL * |sum|
_CHECK = RECOMPUTE_TOL / EPS


class RollingMean(_LazyWindow):
    """Arithmetic mean of the last ``window`` finite values (fewer while filling up).

    The sum is maintained in O(1) per value (``s += x - oldest``). Alongside it an upper bound
    of the accumulated rounding error is kept (the standard bound for recursive summation,
    ``eps * sum |partial sums|``); as soon as that bound exceeds ``1e-10`` of the current sum,
    the sum is recomputed exactly (``math.fsum``) from the window. So a huge value that leaves
    the window (``[1e20, 1, 2, 3]`` -> ``[1, 2, 3]``) cannot poison the mean, and in ordinary
    data the O(window) recompute almost never runs. Values near the float limits (sum
    overflowing) are handled by a rescaled exact mean.

    ``update`` only appends (see ``_LazyWindow``); the sum is advanced when the mean is read.

    Examples
    --------
    >>> m = RollingMean(window=3)
    >>> for x in [1.0, 2.0, 3.0, 4.0]:
    ...     m.update(x)
    >>> m.get()
    3.0
    """

    __slots__ = ("_sum", "_err")

    def __init__(self, window: int):
        super().__init__(window)
        self._sum = 0.0
        self._err = 0.0  # sum of |partial sums| (+ |differences|) since the last exact sum

    def _sync(self) -> None:
        p = self._pending
        if not p:
            return
        buf = self._buf
        if p >= self.window:
            self._sum = s = exact_sum(buf)
            self._err = abs(s)
        else:
            gone = self._gone
            w = self.window
            size = len(buf) - p + len(gone)
            gi = 0
            s = self._sum
            err = self._err
            for i in range(-p, 0):
                x = buf[i]
                if size == w:
                    d = x - gone[gi]
                    gi += 1
                    s += d
                    err += abs(s) + abs(d)
                else:
                    size += 1
                    s += x
                    err += abs(s)
                if not (err <= _CHECK * abs(s) and err < INF):
                    s = exact_sum(self._window_at(gi, i))
                    err = abs(s)  # the correctly rounded sum is off by up to eps * |sum|
            self._sum = s
            self._err = err
        self._gone.clear()
        self._pending = 0

    def get(self) -> float:
        if self._pending:
            self._sync()
        n = len(self._buf)
        if n == 0:
            return math.nan
        s = self._sum
        if s - s != 0.0:  # the true sum overflows: mean via rescaling
            return exact_mean(self._buf)
        return s / n

    def _dump(self) -> dict[str, Any]:
        d = self._dump_window()
        d["sum"] = self._sum
        d["err"] = self._err
        return d

    def _load(self, state: dict[str, Any]) -> None:
        self._load_window(state)
        self._sum = state["sum"]
        self._err = state["err"]
