"""Exponential moving average with Adam-style bias correction."""

from __future__ import annotations

import math
from typing import Any

from .base import Statistic, check_float

__all__ = ["EMA"]


class EMA(Statistic):
    """Exponentially weighted mean, bias-corrected for the first steps.

    The raw average ``m_t = (1 - alpha) * m_{t-1} + alpha * x_t`` starts at ``m_0 = 0`` and is
    therefore biased towards zero early on; like Adam we divide by ``1 - (1 - alpha)^t``
    (``t`` = number of finite values seen). The result is exactly the weighted mean of the values
    seen with weights ``(1 - alpha)^(t - i)``: the first value is returned as is, a constant series
    gives that constant. Internally the corrected value is updated directly
    (``c += alpha / (1 - (1 - alpha)^t) * (x - c)``), which is the same quantity without the
    rounding of the division.

    Parameters
    ----------
    alpha
        Weight of the newest value, in (0, 1].
    span
        Alternative to ``alpha``: ``alpha = 2 / (span + 1)`` (pandas' convention), ``span >= 1``.

    Examples
    --------
    >>> ema = EMA(alpha=0.5)
    >>> for x in [1.0, 2.0, float("nan"), 3.0]:
    ...     ema.update(x)
    >>> round(ema.get(), 6)  # (1*1 + 2*2 + 4*3) / (1 + 2 + 4)
    2.428571
    >>> ema.n, ema.n_skipped
    (3, 1)
    """

    __slots__ = ("alpha", "span", "n", "_c", "_pow", "_om")

    def __init__(self, alpha: float | None = None, span: float | None = None):
        if (alpha is None) == (span is None):
            raise ValueError("give exactly one of alpha or span")
        if span is not None:
            span = check_float("span", span, low=1.0)
            alpha = 2.0 / (span + 1.0)
        else:
            alpha = check_float("alpha", alpha, low=0.0, high=1.0, low_open=True)
        if 1.0 - alpha == 1.0:
            raise ValueError(f"alpha must be > 1e-16 (1 - alpha must differ from 1), got {alpha}")
        self.alpha = alpha
        self._om = 1.0 - alpha
        self.span = span
        self.n = 0
        self.n_skipped = 0
        self._c = math.nan
        self._pow = 1.0  # (1 - alpha) ** n

    def _add(self, x: float) -> None:
        self.n += 1
        c = self._c
        p = self._pow
        if p:  # first values: bias-corrected weight alpha / (1 - (1 - alpha)^n)
            if p == 1.0:  # first value
                self._pow = self._om
                self._c = x
                return
            p *= self._om
            if p < 1e-17:  # 1 - p == 1.0 from here on: no correction left to apply
                p = 0.0
            self._pow = p
            g = self.alpha / (1.0 - p)
        else:
            g = self.alpha
        c2 = c + g * (x - c)
        if c2 - c2 != 0.0:  # x - c overflowed (values near the float limits)
            c2 = c * (1.0 - g) + x * g
        self._c = c2

    def get(self) -> float:
        return self._c

    def _params(self) -> dict[str, Any]:
        if self.span is not None:
            return {"span": self.span}
        return {"alpha": self.alpha}

    def _dump(self) -> dict[str, Any]:
        return {"n": self.n, "c": self._c, "pow": self._pow}

    def _load(self, state: dict[str, Any]) -> None:
        self.n = state["n"]
        self._c = state["c"]
        self._pow = state["pow"]
