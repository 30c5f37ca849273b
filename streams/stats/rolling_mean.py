"""Mean of the last ``window`` values, O(1) per update."""

from __future__ import annotations

import math
from collections.abc import Sequence
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

    Evaluation is adaptive (see ``_LazyWindow``): eager while the mean is read every step,
    deferred to the next read otherwise, with identical results.

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

    def _step(self, x: float, size: int) -> int:
        if size == self.window:
            d = x - self._buf.popleft()
            s = self._sum + d
            err = self._err + (abs(s) + abs(d))
        else:
            size += 1
            s = self._sum + x
            err = self._err + abs(s)
        if err <= _CHECK * abs(s) and err < INF:
            self._sum = s
            self._err = err
        else:
            self._exact_sum(self._front(size))
        return size

    def _exact_sum(self, vals: Sequence[float]) -> None:
        self._sum = s = exact_sum(vals)
        self._err = abs(s)  # the correctly rounded sum is off by up to eps * |sum|

    def _rebuild(self) -> None:
        self._exact_sum(self._buf)

    def get(self) -> float:
        self._ready()
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
