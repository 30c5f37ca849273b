"""DDSketch: a mergeable quantile sketch with relative-error guarantees (Masson et al., 2019)."""

from __future__ import annotations

import math
from typing import Any

from .base import Statistic, check_float, check_int

__all__ = ["DDSketch"]

_LOG_MAX = math.log(1.7976931348623157e308)


class DDSketch(Statistic):
    """Quantiles of everything seen, each within ``relative_accuracy`` of the true value.

    Positive values ``x`` go to bucket ``ceil(log_gamma(x))`` with
    ``gamma = (1 + a) / (1 - a)``; negative values to the same buckets of ``|x|`` in a separate
    store; zeros are counted apart. A bucket is answered by ``2 gamma^k / (gamma + 1)``, which is
    within relative error ``a`` of every value in it. ``quantile(q)`` returns (a value within
    ``a`` of) the element of rank ``floor(q * (count - 1))`` - numpy's ``method="lower"`` - and
    is clamped to the exact minimum and maximum seen.

    Memory is bounded: each store keeps at most ``max_bins`` buckets; beyond that the lowest
    buckets (smallest magnitudes) are collapsed into one, so only the accuracy of the smallest
    magnitudes degrades. ``merge`` adds the buckets of another sketch with the same accuracy: as
    long as nothing was collapsed, the merged sketch is identical to the sketch of the
    concatenated data.

    ``get()`` is the median; ``count`` the number of values.

    Examples
    --------
    >>> sk = DDSketch(relative_accuracy=0.01)
    >>> for x in range(1, 1001):
    ...     sk.update(float(x))
    >>> abs(sk.quantile(0.9) - 900.0) / 900.0 <= 0.01
    True
    >>> other = DDSketch(0.01)
    >>> other.update(-5.0)
    >>> sk.merge(other)
    >>> sk.count, sk.quantile(0.0)
    (1001, -5.0)
    """

    __slots__ = (
        "relative_accuracy",
        "max_bins",
        "_lng",
        "_inv_lng",
        "_rep",
        "_pos",
        "_neg",
        "_zero",
        "_count",
        "_min",
        "_max",
        "_pos_floor",
        "_neg_floor",
    )

    def __init__(self, relative_accuracy: float = 0.01, max_bins: int = 2048):
        self.relative_accuracy = check_float(
            "relative_accuracy", relative_accuracy, low=0.0, high=1.0, low_open=True, high_open=True
        )
        self.max_bins = check_int("max_bins", max_bins, 2)
        a = self.relative_accuracy
        gamma = (1.0 + a) / (1.0 - a)
        self._lng = math.log(gamma)
        self._inv_lng = 1.0 / self._lng
        self._rep = math.log(2.0 / (1.0 + gamma))  # log of the bucket representative factor
        self.n_skipped = 0
        self._pos: dict[int, int] = {}
        self._neg: dict[int, int] = {}
        self._zero = 0
        self._count = 0
        self._min = math.inf
        self._max = -math.inf
        # after a collapse, keys below the floor are counted in the floor bucket
        self._pos_floor: int | None = None
        self._neg_floor: int | None = None

    # -- updates -------------------------------------------------------------------------------
    def _add(self, x: float) -> None:
        self._count += 1
        if x < self._min:
            self._min = x
        if x > self._max:
            self._max = x
        if x > 0.0:
            self._pos_floor = self._insert(self._pos, self._pos_floor, x)
        elif x < 0.0:
            self._neg_floor = self._insert(self._neg, self._neg_floor, -x)
        else:
            self._zero += 1

    def _insert(self, store: dict[int, int], floor: int | None, mag: float) -> int | None:
        """Count the magnitude ``mag > 0`` in ``store``; return the store's (new) floor."""
        k = math.ceil(math.log(mag) * self._inv_lng)
        if floor is not None and k < floor:
            k = floor
        store[k] = store.get(k, 0) + 1
        if len(store) > self.max_bins:
            floor = self._collapse(store)
        return floor

    def _collapse(self, store: dict[int, int]) -> int:
        """Fold the lowest buckets into one so that ``max_bins`` remain; return the floor key."""
        keys = sorted(store)
        floor = keys[len(keys) - self.max_bins]
        extra = 0
        for k in keys[: len(keys) - self.max_bins]:
            extra += store.pop(k)
        store[floor] += extra
        return floor

    def merge(self, other: DDSketch) -> None:
        """Add ``other``'s values to this sketch (in place)."""
        if not isinstance(other, DDSketch):
            raise TypeError(f"cannot merge a DDSketch with a {type(other).__name__}")
        if other.relative_accuracy != self.relative_accuracy:
            raise ValueError("cannot merge sketches with different relative accuracies")
        for mine, theirs, attr in (
            (self._pos, other._pos, "_pos_floor"),
            (self._neg, other._neg, "_neg_floor"),
        ):
            floors = [f for f in (getattr(self, attr), getattr(other, attr)) if f is not None]
            floor = max(floors) if floors else None
            if floor is not None:
                low = [k for k in mine if k < floor]
                moved = sum(mine.pop(k) for k in low)
                if moved:
                    mine[floor] = mine.get(floor, 0) + moved
            for k, c in theirs.items():
                if floor is not None and k < floor:
                    k = floor
                mine[k] = mine.get(k, 0) + c
            if len(mine) > self.max_bins:
                floor = self._collapse(mine)
            setattr(self, attr, floor)
        self._zero += other._zero
        self._count += other._count
        self.n_skipped += other.n_skipped
        if other._min < self._min:
            self._min = other._min
        if other._max > self._max:
            self._max = other._max

    # -- queries -------------------------------------------------------------------------------
    def _value(self, k: int) -> float:
        lv = k * self._lng + self._rep
        return math.exp(lv if lv < _LOG_MAX else _LOG_MAX)

    def quantile(self, q: float) -> float:
        """Approximate ``q``-quantile (``0 <= q <= 1``); NaN when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        n = self._count
        if n == 0:
            return math.nan
        if q == 0.0:
            return self._min
        if q == 1.0:
            return self._max
        rank = q * (n - 1)
        cum = 0
        v: float | None = None
        for k in sorted(self._neg, reverse=True):
            cum += self._neg[k]
            if cum > rank:
                v = -self._value(k)
                break
        if v is None:
            cum += self._zero
            if cum > rank:
                v = 0.0
        if v is None:
            for k in sorted(self._pos):
                cum += self._pos[k]
                if cum > rank:
                    v = self._value(k)
                    break
        if v is None:  # pragma: no cover - rank < n always lands in a bucket
            v = self._max
        return min(max(v, self._min), self._max)

    def get(self) -> float:
        return self.quantile(0.5)

    @property
    def count(self) -> int:
        return self._count

    @property
    def n(self) -> int:
        return self._count

    @property
    def min(self) -> float:
        return self._min if self._count else math.nan

    @property
    def max(self) -> float:
        return self._max if self._count else math.nan

    @property
    def num_bins(self) -> int:
        return len(self._pos) + len(self._neg) + (1 if self._zero else 0)

    # -- state ---------------------------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        return {"relative_accuracy": self.relative_accuracy, "max_bins": self.max_bins}

    def _dump(self) -> dict[str, Any]:
        return {
            "pos": [[k, c] for k, c in sorted(self._pos.items())],
            "neg": [[k, c] for k, c in sorted(self._neg.items())],
            "zero": self._zero,
            "count": self._count,
            "min": self._min,
            "max": self._max,
            "pos_floor": self._pos_floor,
            "neg_floor": self._neg_floor,
        }

    def _load(self, state: dict[str, Any]) -> None:
        self._pos = {int(k): int(c) for k, c in state["pos"]}
        self._neg = {int(k): int(c) for k, c in state["neg"]}
        self._zero = state["zero"]
        self._count = state["count"]
        self._min = state["min"]
        self._max = state["max"]
        pf, nf = state["pos_floor"], state["neg_floor"]
        # _enc stores None for a missing floor, which _dec turns into NaN
        self._pos_floor = None if pf is None or pf != pf else int(pf)
        self._neg_floor = None if nf is None or nf != nf else int(nf)
