"""Rolling Spearman correlation between two scalar series."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from .base import Stateful, check_int
from .distribution import spearman

__all__ = ["RollingCorrelation"]


class RollingCorrelation(Stateful):
    """Spearman rank correlation of the last ``window`` pairs ``(x, y)`` fed with
    ``update_pair(x, y)``.

    A pair with a non-finite member is ignored (``n_skipped``). ``get()`` is NaN with fewer than
    3 pairs or when either side is constant; computed lazily and cached until the next pair.
    (For a per-step correlation between two per-sample arrays, call
    :func:`~streams.stats.distribution.spearman` each step and feed the result to an ``EMA``.)

    Not a :class:`~streams.stats.base.Statistic` (it takes pairs), but it has the same
    ``get`` / ``to_state`` / ``from_state`` and is rebuilt by ``stat_from_state``.

    Examples
    --------
    >>> rc = RollingCorrelation(window=4)
    >>> for x, y in [(1, 5), (2, 6), (3, 7), (4, 8), (5, 1)]:
    ...     rc.update_pair(x, y)
    >>> rc.get()
    -0.2
    """

    __slots__ = ("window", "_xs", "_ys", "_cache")

    def __init__(self, window: int):
        self.window = check_int("window", window, 3)
        self.n_skipped = 0
        self._xs: deque[float] = deque(maxlen=self.window)
        self._ys: deque[float] = deque(maxlen=self.window)
        self._cache: float | None = None

    def update_pair(self, x: float, y: float) -> None:
        try:
            x = float(x)
            y = float(y)
        except (TypeError, ValueError, OverflowError):
            x = math.nan
        if x - x != 0.0 or y - y != 0.0:
            self.n_skipped += 1
            return
        self._xs.append(x)
        self._ys.append(y)
        self._cache = None

    def get(self) -> float:
        c = self._cache
        if c is None:
            c = spearman(self._xs, self._ys) if len(self._xs) >= 3 else math.nan
            self._cache = c
        return c

    @property
    def n(self) -> int:
        return len(self._xs)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window}

    def _dump(self) -> dict[str, Any]:
        return {"xs": list(self._xs), "ys": list(self._ys)}

    def _load(self, state: dict[str, Any]) -> None:
        self._xs = deque(state["xs"], maxlen=self.window)
        self._ys = deque(state["ys"], maxlen=self.window)
