"""Exact rolling median absolute deviation."""

from __future__ import annotations

from typing import Any

from ._num import MAD_TO_SIGMA, sorted_mad, sorted_median
from .rolling_quantile import _SortedWindow

__all__ = ["RollingMAD"]


class RollingMAD(_SortedWindow):
    """Median of ``|x - median|`` over the last ``window`` finite values.

    Raw by default; ``scaled=True`` multiplies by 1.4826 so that it estimates the standard
    deviation of normal data. ``get()`` is O(log window): the deviations are two sorted runs
    either side of the median and their median is found by binary search, without sorting.

    Examples
    --------
    >>> mad = RollingMAD(window=5)
    >>> for x in [1.0, 2.0, 3.0, 4.0, 100.0]:
    ...     mad.update(x)
    >>> mad.get()
    1.0
    >>> round(RollingMAD.from_state(mad.to_state()).get(), 3)
    1.0
    """

    __slots__ = ("scaled", "_hint")

    def __init__(self, window: int, scaled: bool = False):
        super().__init__(window)
        if not isinstance(scaled, bool):
            raise ValueError(f"scaled must be a bool, got {scaled!r}")
        self.scaled = scaled
        self._hint = -1  # the previous split (see sorted_mad): a warm start, never the answer

    def get(self) -> float:
        s = self._sync()
        med = sorted_median(s)
        if med != med:
            return med
        mad, self._hint = sorted_mad(s, med, self._hint)
        return mad * MAD_TO_SIGMA if self.scaled else mad

    @property
    def median(self) -> float:
        return sorted_median(self._sync())

    def _params(self) -> dict[str, Any]:
        p: dict[str, Any] = {"window": self.window}
        if self.scaled:
            p["scaled"] = True
        return p
