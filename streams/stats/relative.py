"""Relative drop from the window's peak / rise from its trough."""

from __future__ import annotations

import math

from .base import _NewestValue
from .rolling_minmax import RollingMax, RollingMin, _RollingExtremum

__all__ = ["RelativeDrop", "RelativeRise"]


class _Relative(_NewestValue):
    """Shared mechanics of :class:`RelativeDrop` and :class:`RelativeRise` (a mixin over a
    ``_RollingExtremum``): the newest value's distance from the window's extremum, relative to
    the extremum's magnitude, signed by the extremum's ``_sign`` so that it is >= 0."""

    __slots__ = ()

    def __init__(self, window: int):
        super().__init__(window)  # type: ignore[call-arg]
        self._last = math.nan

    def _add(self, x: float) -> None:
        _RollingExtremum._add(self, x)  # type: ignore[arg-type]
        self._last = x

    def get(self) -> float:
        q = self._q
        if not q:
            return math.nan
        ext = q[0][1]
        if ext == 0.0:
            return math.nan
        hi, lo = (ext, self._last) if self._sign > 0 else (self._last, ext)
        r = (hi - lo) / abs(ext)
        if r - r != 0.0:  # hi - lo overflowed
            r = hi / abs(ext) - lo / abs(ext)
        return r


class RelativeDrop(_Relative, RollingMax):
    """Fraction by which the newest value is below the maximum of the last ``window`` values.

    ``(peak - x) / |peak|``: 0.6 means the newest value is 60% below the window's peak; 0 means
    the newest value is the peak. The window includes the newest value, so the result is >= 0.
    For a negative peak the fraction is relative to its magnitude (peak -1, newest -3 gives
    2.0). NaN when empty or when the peak is exactly 0 (a relative drop from 0 is undefined).

    Examples
    --------
    >>> rd = RelativeDrop(window=5)
    >>> for x in [4.0, 10.0, 7.0, 4.0]:
    ...     rd.update(x)
    >>> rd.get()
    0.6
    """

    __slots__ = ("_last",)

    @property
    def peak(self) -> float:
        return RollingMax.get(self)


class RelativeRise(_Relative, RollingMin):
    """Fraction by which the newest value is above the minimum of the last ``window`` values.

    ``(x - trough) / |trough|``: 1.5 means the newest value is 150% above the window's trough.
    NaN when empty or when the trough is exactly 0.

    Examples
    --------
    >>> rr = RelativeRise(window=5)
    >>> for x in [4.0, 2.0, 3.0, 5.0]:
    ...     rr.update(x)
    >>> rr.get()
    1.5
    """

    __slots__ = ("_last",)

    @property
    def trough(self) -> float:
        return RollingMin.get(self)
