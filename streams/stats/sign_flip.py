"""Step-to-step sign flips (oscillation of a metric such as the reward)."""

from __future__ import annotations

import math

import numpy as np

from ._window import _CachedWindow

__all__ = ["SignFlipRate"]


class SignFlipRate(_CachedWindow):
    """Share of consecutive step-to-step changes whose sign flips, over the last ``window``
    values.

    With differences ``d_i = x_i - x_{i-1}`` inside the window, ``get()`` is the number of
    consecutive pairs with ``d_i * d_{i+1} < 0`` divided by the number of consecutive pairs in
    which both differences are non-zero (a repeated value neither flips nor counts). An
    alternating series gives 1.0, a monotone one 0.0, i.i.d. noise about 2/3. NaN when there is
    no such pair.

    ``diff_std_ratio`` = ``std(d) / (std(x) + 1e-12 * max|x|)`` (population std, ``ddof=0``,
    both over the window; the tiny term is relative to the window's magnitude so the ratio is
    scale-free): about sqrt(2) for i.i.d. noise, up to 2 for a pure oscillation, near 0 for a
    smooth trend, 0 for a constant window.

    Computed lazily with numpy on ``get()`` and cached until the next update.

    Examples
    --------
    >>> sf = SignFlipRate(window=6)
    >>> for x in [1.0, 3.0, 1.0, 3.0, 1.0, 3.0]:
    ...     sf.update(x)
    >>> sf.get(), round(sf.diff_std_ratio, 3)
    (1.0, 1.96)
    """

    __slots__ = ()

    def __init__(self, window: int):
        super().__init__(window, 3)

    def _calc(self) -> tuple[float, float]:
        if len(self._buf) < 2:
            return (math.nan, math.nan)
        x = np.asarray(self._buf, dtype=float)
        with np.errstate(over="ignore"):
            sg = np.sign(np.diff(x))  # signs from the raw values (an overflow keeps its sign)
        scale = float(np.max(np.abs(x)))
        if scale > 0:
            x = x / scale  # the ratio is scale-free; avoids overflow near 1e300
        d = np.diff(x)
        prod = sg[:-1] * sg[1:]
        valid = int(np.count_nonzero(prod))
        rate = float(np.count_nonzero(prod < 0)) / valid if valid else math.nan
        sx = float(np.std(x))
        ratio = float(np.std(d)) / (sx + 1e-12) if scale > 0 else 0.0
        return (rate, ratio)

    @property
    def diff_std_ratio(self) -> float:
        return self._compute()[1]
