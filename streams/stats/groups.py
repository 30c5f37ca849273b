"""Trends of several categories side by side (e.g. reward per task type)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from ._num import theil_sen
from .base import Stateful, check_float, check_int
from .ema import EMA

__all__ = ["GroupTrends"]


class GroupTrends(Stateful):
    """Per-category rolling trends and the gap between categories.

    ``update({category: value, ...})`` is one step; a category absent from a step simply has no
    value at that step (the step index still advances, so slopes are per step).
    Non-finite values are skipped (``n_skipped``).

    * ``slopes()``: ``{category: Theil-Sen slope per step}`` over each category's last
      ``window`` values (NaN with fewer than 2).
    * ``gap()``: ``max - min`` over categories of their EMA (``alpha``); NaN with fewer than
      two categories. ``get()`` is the same.
    * ``gap_trend()``: Theil-Sen slope per step of the gap over the last ``window`` steps.

    At most ``max_categories`` categories are tracked; values of further new categories are
    ignored and counted in ``n_dropped``. Categories may be str or int.

    Examples
    --------
    >>> gt = GroupTrends(window=10, alpha=1.0)
    >>> for t in range(5):
    ...     gt.update({"math": 1.0 + t, "code": 1.0})
    >>> gt.slopes()
    {'math': 1.0, 'code': 0.0}
    >>> gt.gap(), gt.gap_trend()
    (4.0, 1.0)
    """

    __slots__ = (
        "window",
        "alpha",
        "max_categories",
        "n_dropped",
        "_t",
        "_series",
        "_emas",
        "_gaps",
    )

    def __init__(self, window: int, alpha: float = 0.1, max_categories: int = 1000):
        self.window = check_int("window", window, 2)
        self.alpha = check_float("alpha", alpha, low=0.0, high=1.0, low_open=True)
        self.max_categories = check_int("max_categories", max_categories, 1)
        self.n_skipped = 0
        self.n_dropped = 0
        self._t = 0
        self._series: dict[Any, deque[tuple[int, float]]] = {}
        self._emas: dict[Any, EMA] = {}
        self._gaps: deque[tuple[int, float]] = deque(maxlen=self.window)

    def update(self, values: dict[Any, float]) -> None:
        t = self._t
        for cat, v in values.items():
            try:
                x = float(v)
            except (TypeError, ValueError, OverflowError):
                x = math.nan
            if x - x != 0.0:
                self.n_skipped += 1
                continue
            series = self._series.get(cat)
            if series is None:
                if len(self._series) >= self.max_categories:
                    self.n_dropped += 1
                    continue
                series = self._series[cat] = deque(maxlen=self.window)
                self._emas[cat] = EMA(alpha=self.alpha)
            series.append((t, x))
            self._emas[cat].update(x)
        g = self.gap()
        if g == g:
            self._gaps.append((t, g))
        self._t = t + 1

    def slopes(self) -> dict[Any, float]:
        out = {}
        for cat, series in self._series.items():
            if len(series) < 2:
                out[cat] = math.nan
            else:
                out[cat] = theil_sen([v for _, v in series], [t for t, _ in series])
        return out

    def latest(self) -> dict[Any, float]:
        """``{category: EMA}``."""
        return {cat: e.get() for cat, e in self._emas.items()}

    def gap(self) -> float:
        vals = [e.get() for e in self._emas.values()]
        vals = [v for v in vals if v == v]
        if len(vals) < 2:
            return math.nan
        return max(vals) - min(vals)

    def gap_trend(self) -> float:
        if len(self._gaps) < 2:
            return math.nan
        return theil_sen([g for _, g in self._gaps], [t for t, _ in self._gaps])

    def get(self) -> float:
        return self.gap()

    @property
    def categories(self) -> list[Any]:
        return list(self._series)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window, "alpha": self.alpha, "max_categories": self.max_categories}

    def _dump(self) -> dict[str, Any]:
        return {
            "t": self._t,
            "n_dropped": self.n_dropped,
            "series": [
                [cat, [[t, v] for t, v in s], self._emas[cat]._dump()]
                for cat, s in self._series.items()
            ],
            "gaps": [[t, g] for t, g in self._gaps],
        }

    def _load(self, state: dict[str, Any]) -> None:
        self._t = state["t"]
        self.n_dropped = state["n_dropped"]
        self._series = {}
        self._emas = {}
        for cat, pairs, ema_state in state["series"]:
            self._series[cat] = deque(((int(t), v) for t, v in pairs), maxlen=self.window)
            e = EMA(alpha=self.alpha)
            e._load(ema_state)
            self._emas[cat] = e
        self._gaps = deque(((int(t), g) for t, g in state["gaps"]), maxlen=self.window)
