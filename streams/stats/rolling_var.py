"""Variance and standard deviation of the last ``window`` values, O(1) per update."""

from __future__ import annotations

import math
from typing import Any

from ._num import EPS, INF, RECOMPUTE_TOL, exact_mean, exact_std, exact_sum
from ._window import _LazyWindow
from .base import check_int

__all__ = ["RollingStd", "RollingVar"]

# Below / above these the variance is computed by the rescaled exact path (squares of values
# near 1e-160 lose precision to underflow, squares near 1e160 overflow).
_VAR_LOW = 1e-280
_VAR_HIGH = 1e280
# recompute when 4 * eps * E > RECOMPUTE_TOL * (S2 - S1^2 / n)
_CHECK = RECOMPUTE_TOL / (4.0 * EPS)


class _RollingMoments(_LazyWindow):
    """Shared machinery: shifted sums with an error bound and exact recompute.

    Keeps ``S1 = sum(x - K)`` and ``S2 = sum((x - K)^2)`` over the window, with the shift ``K``
    set to the window mean at every exact recompute (so offsets like ``1e8 + noise`` cost no
    precision). ``E`` accumulates an upper bound of the rounding error of ``S2 - S1^2/n``; as
    soon as ``4 * eps * E`` exceeds ``1e-10`` of that quantity, the sums are recomputed exactly
    from the window (``math.fsum``). This bounds the relative error of the variance by about
    1e-10 (and the error of the mean by about 1e-10 of the standard deviation) at amortised
    O(1) cost, whatever leaves the window. Evaluation is adaptive (see ``_LazyWindow``): eager
    while results are read every step, deferred to the next read otherwise, same results.
    """

    __slots__ = ("ddof", "_k", "_s1", "_s2", "_e")

    def __init__(self, window: int, ddof: int = 1):
        ddof = check_int("ddof", ddof, 0)
        super().__init__(window, 2 if ddof >= 1 else 1)
        self.ddof = ddof
        if self.ddof >= self.window:
            raise ValueError(f"ddof must be < window, got ddof={ddof}, window={window}")
        self._k = 0.0
        self._s1 = 0.0
        self._s2 = 0.0
        self._e = 0.0

    def _recompute(self, vals) -> None:
        k = exact_mean(vals) if vals else 0.0
        self._k = k
        devs = [v - k for v in vals]
        self._s1 = exact_sum(devs)
        try:
            self._s2 = math.fsum([d * d for d in devs])
        except OverflowError:
            self._s2 = INF
        # the rounding of the two sums themselves: eps * S2 bounds both contributions
        self._e = self._s2

    def _step(self, x: float, size: int) -> int:
        k = self._k
        xk = x - k
        xk2 = xk * xk
        if size == self.window:
            ok = self._buf.popleft() - k
            ok2 = ok * ok
            s1 = self._s1 + (xk - ok)
            s2 = self._s2 + (xk2 - ok2)
            e = self._e + (s2 + xk2 + ok2)
        else:
            size += 1
            s1 = self._s1 + xk
            s2 = self._s2 + xk2
            e = self._e + (s2 + xk2)
        if e <= _CHECK * (s2 - s1 * s1 / size) and e < INF:
            self._s1 = s1
            self._s2 = s2
            self._e = e
        else:
            self._recompute(self._front(size))
        return size

    def _rebuild(self) -> None:
        self._recompute(self._buf)

    def _is_constant(self) -> bool:
        buf = self._buf
        return buf.count(buf[0]) == len(buf)

    def _fast_var(self) -> float | None:
        """The variance from the shifted sums (NaN while undefined), or None where squares of
        the spread lose precision and the exact path must answer."""
        self._ready()
        n = len(self._buf)
        if n <= self.ddof:
            return math.nan
        s1 = self._s1
        var = (self._s2 - s1 * s1 / n) / (n - self.ddof)
        return var if _VAR_LOW < var < _VAR_HIGH else None

    def _var(self) -> float:
        var = self._fast_var()
        if var is None:
            if self._is_constant():
                return 0.0
            sd = exact_std(self._buf, self.ddof)
            return sd * sd
        return var

    def _std(self) -> float:
        var = self._fast_var()
        if var is None:
            return 0.0 if self._is_constant() else exact_std(self._buf, self.ddof)
        return math.sqrt(var)

    def _mean(self) -> float:
        self._ready()
        buf = self._buf
        n = len(buf)
        if n == 0:
            return math.nan
        s1 = self._s1
        m = self._k + s1 / n
        # the shifted sums bound the mean's error by ~1e-10 of the spread, as long as the
        # squares are representable; otherwise (spread near 1e-150 or 1e150) recompute
        if not _VAR_LOW < (self._s2 - s1 * s1 / n) < _VAR_HIGH or m - m != 0.0:
            if self._is_constant():
                return buf[0] + 0.0
            return exact_mean(buf)
        return m

    @property
    def mean(self) -> float:
        """Mean of the window (accurate to ~1e-10 of the spread; see the class docstring)."""
        return self._mean()

    def _params(self) -> dict[str, Any]:
        p: dict[str, Any] = {"window": self.window}
        if self.ddof != 1:
            p["ddof"] = self.ddof
        return p

    def _dump(self) -> dict[str, Any]:
        d = self._dump_window()
        d.update(k=self._k, s1=self._s1, s2=self._s2, e=self._e)
        return d

    def _load(self, state: dict[str, Any]) -> None:
        self._load_window(state)
        self._k = state["k"]
        self._s1 = state["s1"]
        self._s2 = state["s2"]
        self._e = state["e"]


class RollingVar(_RollingMoments):
    """Sample variance (``ddof=1`` by default) of the last ``window`` finite values.

    O(1) per update with a guaranteed relative error of about 1e-10 (see
    ``_RollingMoments``). A window of identical values gives exactly 0. NaN while fewer than
    ``ddof + 1`` values. If the true variance exceeds the float range (spread beyond ~1e154) the
    answer is ``inf``, like numpy; use :class:`RollingStd`, which stays finite.

    Examples
    --------
    >>> v = RollingVar(window=3)
    >>> for x in [10.0, 1.0, 2.0, 3.0]:
    ...     v.update(x)
    >>> v.get()
    1.0
    """

    __slots__ = ()

    def get(self) -> float:
        return self._var()


class RollingStd(_RollingMoments):
    """Sample standard deviation (``ddof=1`` by default) of the last ``window`` finite values.

    Same machinery as :class:`RollingVar`; values near the float limits (1e300 or 1e-300) are
    handled by a rescaled exact computation, so the result is accurate wherever it is
    representable.

    Examples
    --------
    >>> s = RollingStd(window=4)
    >>> for x in [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]:
    ...     s.update(x)
    >>> round(s.get(), 6)
    1.914854
    """

    __slots__ = ()

    def get(self) -> float:
        return self._std()
