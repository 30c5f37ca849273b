"""Baseline frozen at the start of a run."""

from __future__ import annotations

import math
from typing import Any

from ._num import exact_mean, exact_std, sorted_median
from .base import Statistic, check_int

__all__ = ["WarmupBaseline"]


class WarmupBaseline(Statistic):
    """Mean, standard deviation (``ddof=1``) and median of the first ``warmup`` finite values.

    Values are collected until ``warmup`` of them have been seen; then the three numbers are
    computed exactly, frozen, and the values are dropped (so memory is bounded by ``warmup``).
    Later values are counted (``n_after``) but change nothing. Before the baseline is frozen
    ``get()``, ``mean``, ``std`` and ``median`` are NaN. ``std`` is NaN for ``warmup=1``.

    Examples
    --------
    >>> wb = WarmupBaseline(warmup=3)
    >>> for x in [1.0, 2.0, 6.0, 100.0]:
    ...     wb.update(x)
    >>> wb.frozen, wb.get(), wb.median, round(wb.std, 6)
    (True, 3.0, 2.0, 2.645751)
    """

    __slots__ = ("warmup", "frozen", "mean", "std", "median", "n_after", "_vals")

    def __init__(self, warmup: int):
        self.warmup = check_int("warmup", warmup, 1)
        self.n_skipped = 0
        self.frozen = False
        self.mean = math.nan
        self.std = math.nan
        self.median = math.nan
        self.n_after = 0
        self._vals: list[float] = []

    def _add(self, x: float) -> None:
        if self.frozen:
            self.n_after += 1
            return
        vals = self._vals
        vals.append(x)
        if len(vals) >= self.warmup:
            self.mean = exact_mean(vals)
            self.std = exact_std(vals, 1)
            self.median = sorted_median(sorted(vals))
            self.frozen = True
            self._vals = []

    def get(self) -> float:
        return self.mean

    @property
    def n(self) -> int:
        """Number of values that went into the baseline so far."""
        return self.warmup if self.frozen else len(self._vals)

    def _params(self) -> dict[str, Any]:
        return {"warmup": self.warmup}

    def _dump(self) -> dict[str, Any]:
        return {
            "frozen": self.frozen,
            "mean": self.mean,
            "std": self.std,
            "median": self.median,
            "n_after": self.n_after,
            "vals": list(self._vals),
        }

    def _load(self, state: dict[str, Any]) -> None:
        self.frozen = bool(state["frozen"])
        self.mean = state["mean"]
        self.std = state["std"]
        self.median = state["median"]
        self.n_after = state["n_after"]
        self._vals = list(state["vals"])
