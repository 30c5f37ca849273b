"""Mann-Kendall trend test and Theil-Sen slope over a rolling window."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from typing import Any

from ._num import theil_sen
from .base import Statistic, check_int

__all__ = ["MannKendall"]

_SQRT2 = math.sqrt(2.0)


class MannKendall(Statistic):
    """Mann-Kendall trend test over the last ``window`` values (in arrival order).

    ``S = sum_{i<j} sign(x_j - x_i)`` is maintained incrementally in O(log window) per update
    with a sorted copy of the window: a new value adds ``#smaller - #larger``, the value leaving
    subtracts ``#larger - #smaller`` of those after it. The sizes of the tie groups come from the
    same bisections, so

    * ``var_s = (n(n-1)(2n+5) - sum_t t(t-1)(2t+5)) / 18`` (tie-corrected),
    * ``z = (S - sign(S)) / sqrt(var_s)`` (continuity correction; ``continuity=False`` gives
      ``S / sqrt(var_s)``, which is what ``scipy.stats.kendalltau(method="asymptotic")`` uses),
    * ``p_value = erfc(|z| / sqrt 2)`` (two-sided, normal approximation),
    * ``tau`` = Kendall's tau-b between time and value (equals ``scipy.stats.kendalltau``),
    * ``slope`` = Theil-Sen median of pairwise slopes per step (computed lazily, O(window^2)).

    All are NaN with fewer than 3 values or when the window is constant. ``get()`` is ``z``.

    Examples
    --------
    >>> mk = MannKendall(window=10)
    >>> for x in [1.0, 2.0, 3.0, 5.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0]:
    ...     mk.update(x)
    >>> mk.s, round(mk.tau, 4), round(mk.z, 3), mk.p_value < 0.001, mk.slope
    (43, 0.9556, 3.757, True, 1.0)
    """

    __slots__ = ("window", "continuity", "_buf", "_sorted", "_s", "_tv", "_tp", "_slope")

    def __init__(self, window: int, continuity: bool = True):
        self.window = check_int("window", window, 3)
        if not isinstance(continuity, bool):
            raise ValueError(f"continuity must be a bool, got {continuity!r}")
        self.continuity = continuity
        self.n_skipped = 0
        self._buf: deque[float] = deque()
        self._sorted: list[float] = []
        self._s = 0  # Mann-Kendall S
        self._tv = 0  # sum over tie groups of t(t-1)(2t+5)
        self._tp = 0  # sum over tie groups of t(t-1)/2
        self._slope: float | None = None

    def _add(self, x: float) -> None:
        buf = self._buf
        s = self._sorted
        self._slope = None
        S = self._s
        tv = self._tv
        tp = self._tp
        if len(buf) >= self.window:
            old = buf.popleft()
            lo = bisect_left(s, old)
            del s[lo]
            hi = bisect_right(s, old, lo) if lo < len(s) and s[lo] == old else lo
            # the oldest value preceded all others: it contributed sign(x_j - old) for each j
            S -= (len(s) - hi) - lo
            c = hi - lo  # its tie group shrinks from c + 1 to c
            tv -= 6 * c * (c + 2)
            tp -= c
        lo = bisect_left(s, x)
        hi = bisect_right(s, x, lo) if lo < len(s) and s[lo] == x else lo
        c = hi - lo  # its tie group grows from c to c + 1
        S += lo - (len(s) - hi)
        s.insert(hi, x)
        buf.append(x)
        self._s = S
        self._tv = tv + 6 * c * (c + 2)
        self._tp = tp + c

    # -- results -------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self._buf)

    @property
    def s(self) -> int:
        """The Mann-Kendall S statistic (concordant minus discordant pairs)."""
        return self._s

    @property
    def var_s(self) -> float:
        n = len(self._buf)
        if n < 3:
            return math.nan
        return (n * (n - 1) * (2 * n + 5) - self._tv) / 18.0

    @property
    def z(self) -> float:
        n = len(self._buf)
        if n < 3:
            return math.nan
        v = n * (n - 1) * (2 * n + 5) - self._tv
        if v <= 0:
            return math.nan
        s = self._s
        if self.continuity and s != 0:
            s = s - 1 if s > 0 else s + 1
        return s / math.sqrt(v / 18.0)

    @property
    def p_value(self) -> float:
        z = self.z
        if z != z:
            return math.nan
        return math.erfc(abs(z) / _SQRT2)

    @property
    def tau(self) -> float:
        n = len(self._buf)
        if n < 3:
            return math.nan
        n0 = n * (n - 1) // 2
        d = n0 - self._tp
        if d <= 0:
            return math.nan
        return self._s / math.sqrt(n0 * d)

    @property
    def slope(self) -> float:
        """Theil-Sen slope (value per step) over the window; cached until the next update."""
        sl = self._slope
        if sl is None:
            sl = theil_sen(self._buf) if len(self._buf) >= 2 else math.nan
            self._slope = sl
        return sl

    def get(self) -> float:
        return self.z

    # -- state ---------------------------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        p: dict[str, Any] = {"window": self.window}
        if not self.continuity:
            p["continuity"] = False
        return p

    def _dump(self) -> dict[str, Any]:
        return {"buf": list(self._buf)}

    def _load(self, state: dict[str, Any]) -> None:
        for x in state["buf"]:
            self.update(x)
