"""Two-sided CUSUM on standardized values."""

from __future__ import annotations

import math
from typing import Any

from ._detector import _ChangeDetector
from ._num import scale_floor
from .base import check_float, check_int

__all__ = ["Cusum"]


class Cusum(_ChangeDetector):
    """Tabular two-sided CUSUM (Page 1954) on values standardized against a learned baseline.

    After each (re)start the first ``warmup`` values estimate the in-control mean ``mu`` and
    sample standard deviation ``sigma`` (floored at ``max(1e-12, 1e-9 * |mu|)``). Then, with
    ``z = (x - mu) / sigma``::

        S_hi = max(0, S_hi + z - k)      S_lo = max(0, S_lo - z - k)

    and an alarm when either exceeds ``h``. ``k`` (allowance) and ``h`` (decision interval) are
    therefore in units of sigma; the classic ``k=0.5, h=5`` detects a one-sigma shift quickly
    with an in-control run length around 465. On an alarm ``detected`` is True for that update
    (``get()`` = 1.0, else 0.0), ``change_count`` increments, ``last_direction`` is +1/-1, and
    the detector restarts, learning the new baseline from the following ``warmup`` values.

    Examples
    --------
    >>> cs = Cusum(k=0.5, h=5.0, warmup=20)
    >>> data = [0.1, -0.1] * 20 + [1.0] * 10
    >>> hits = []
    >>> for i, x in enumerate(data):
    ...     cs.update(x)
    ...     if cs.detected:
    ...         hits.append(i)
    >>> hits
    [40]
    """

    __slots__ = ("k", "h", "warmup", "_n", "_wmean", "_wm2", "_mu", "_sigma", "_hi", "_lo")
    _STATE = ("n", "wmean", "wm2", "mu", "sigma", "hi", "lo")

    def __init__(self, k: float = 0.5, h: float = 5.0, warmup: int = 30):
        self.k = check_float("k", k, low=0.0)
        self.h = check_float("h", h, low=0.0, low_open=True)
        self.warmup = check_int("warmup", warmup, 2)
        super().__init__()

    def _restart(self) -> None:
        self._n = 0  # values since the restart
        self._wmean = 0.0  # Welford accumulators for the warm-up
        self._wm2 = 0.0
        self._mu = math.nan
        self._sigma = math.nan
        self._hi = 0.0
        self._lo = 0.0

    def _add(self, x: float) -> None:
        self.detected = False
        n = self._n + 1
        self._n = n
        if n <= self.warmup:
            d = x - self._wmean
            self._wmean += d / n
            self._wm2 += d * (x - self._wmean)
            if n == self.warmup:
                self._mu = self._wmean
                sd = math.sqrt(max(self._wm2, 0.0) / (n - 1))
                self._sigma = max(sd, scale_floor(self._mu))
            return
        z = (x - self._mu) / self._sigma
        hi = self._hi + z - self.k
        lo = self._lo - z - self.k
        self._hi = hi = hi if hi > 0.0 else 0.0
        self._lo = lo = lo if lo > 0.0 else 0.0
        if hi > self.h or lo > self.h:
            self._alarm(1 if hi >= lo else -1)

    @property
    def statistic(self) -> float:
        """``max(S_hi, S_lo)``: how close the detector is to an alarm (alarm above ``h``)."""
        return max(self._hi, self._lo)

    @property
    def mu(self) -> float:
        return self._mu

    @property
    def sigma(self) -> float:
        return self._sigma

    def _params(self) -> dict[str, Any]:
        return {"k": self.k, "h": self.h, "warmup": self.warmup}
