"""Flat-line detection: relative range of the window."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from ._num import TINY
from .base import check_float, check_int
from .rolling_mean import RollingMean

__all__ = ["Flatline"]


class Flatline(RollingMean):
    """Relative range ``(max - min) / max(|mean|, 1e-12)`` of the last ``window`` values.

    ``is_flat`` is True when the window is full and the relative range is below ``rel_tol``
    (a metric that stopped moving: a stuck loss, a dead logger repeating the last value). A
    window of identical values has relative range exactly 0 and is flat. The ``1e-12`` floor
    keeps the ratio finite for metrics whose mean is 0; metrics living entirely below ~1e-12 in
    magnitude would need rescaling before this test. Amortised O(1) per value: monotonic
    deques for the max and min, and :class:`RollingMean`'s checked running sum for the mean
    (evaluated eagerly while read every step, otherwise on the next read; see ``_LazyWindow``).

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

    __slots__ = ("rel_tol", "_i", "_qmax", "_qmin")

    def __init__(self, window: int, rel_tol: float = 1e-6):
        super().__init__(check_int("window", window, 2))
        self.rel_tol = check_float("rel_tol", rel_tol, low=0.0)
        self._i = 0
        self._qmax: deque[tuple[int, float]] = deque()
        self._qmin: deque[tuple[int, float]] = deque()

    def _step(self, x: float, size: int) -> int:
        self._advance(x)
        return RollingMean._step(self, x, size)

    def _rebuild(self) -> None:
        self._qmax.clear()
        self._qmin.clear()
        for x in self._buf:
            self._advance(x)
        RollingMean._rebuild(self)

    def _advance(self, x: float) -> None:
        """Push one new value on the monotonic deques of ``(index, value)``."""
        i = self._i
        first = i - self.window
        q = self._qmax
        while q and q[-1][1] <= x:
            q.pop()
        q.append((i, x))
        if q[0][0] <= first:
            q.popleft()
        q = self._qmin
        while q and q[-1][1] >= x:
            q.pop()
        q.append((i, x))
        if q[0][0] <= first:
            q.popleft()
        self._i = i + 1

    @property
    def max(self) -> float:
        self._ready()
        return self._qmax[0][1] if self._qmax else math.nan

    @property
    def min(self) -> float:
        self._ready()
        return self._qmin[0][1] if self._qmin else math.nan

    @property
    def mean(self) -> float:
        return RollingMean.get(self)

    @property
    def range(self) -> float:
        self._ready()
        if not self._buf:
            return math.nan
        return self._qmax[0][1] - self._qmin[0][1]

    def get(self) -> float:
        self._ready()
        if not self._buf:
            return math.nan
        hi = self._qmax[0][1]
        lo = self._qmin[0][1]
        if hi == lo:
            return 0.0
        denom = abs(RollingMean.get(self))
        if denom < TINY:
            denom = TINY
        r = (hi - lo) / denom
        if r - r != 0.0:  # hi - lo overflowed
            r = hi / denom - lo / denom
        return r

    @property
    def is_flat(self) -> bool:
        return len(self._buf) >= self.window and self.get() < self.rel_tol

    def _params(self) -> dict[str, Any]:
        return {"window": self.window, "rel_tol": self.rel_tol}

    def _dump(self) -> dict[str, Any]:
        d = super()._dump()
        d["i"] = self._i
        d["qmax"] = [[i, v] for i, v in self._qmax]
        d["qmin"] = [[i, v] for i, v in self._qmin]
        return d

    def _load(self, state: dict[str, Any]) -> None:
        super()._load(state)
        self._i = state["i"]
        self._qmax = deque((int(i), v) for i, v in state["qmax"])
        self._qmin = deque((int(i), v) for i, v in state["qmin"])
