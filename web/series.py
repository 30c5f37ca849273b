"""Bounded, spike-preserving history of a run's step metrics (pure; no I/O, no clock).

:class:`StepTable` keeps every metric of a run against a shared step axis in at most
``capacity`` buckets. While a run is short each bucket is one step. When the table is full,
neighbouring buckets are merged pairwise, so a bucket covers 2, 4, 8 ... steps; memory stays
bounded whatever the run's length.

A bucket keeps, per metric, the minimum and the maximum *with the steps where they occurred*,
the last value, the EMA at its first and last step, and how many values were non-finite. A
view draws each multi-step bucket as two points, its extremes in the order they happened
(min/max decimation), so a one-step spike in a million-step run is still on the chart at its
full height; the EMA is drawn through the same points.

Values are stored in ``array('d')`` columns (8 bytes each), which keeps a 50-run fleet with
forty metrics per run in a few tens of megabytes.
"""

# ruff: noqa: PLR0124 - ``x != x`` is the NaN test on the hot path (no call, no import)

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable

__all__ = ["StepTable", "ema_alpha"]

NAN = math.nan

# per-metric columns of a bucket
MIN, MAX, MIN_STEP, MAX_STEP, EMA0, EMA1, LAST, BAD = range(8)
NCOL = 8


def ema_alpha(span: int) -> float:
    """The smoothing factor of an EMA with the given span (pandas' ``span`` convention)."""
    return 2.0 / (span + 1.0)


def _nan_array(n: int) -> array:
    return array("d", [NAN]) * n


def _finite(x: float) -> bool:
    return x == x and x not in (math.inf, -math.inf)


class StepTable:
    """Step-aligned, min/max-bucketed history of many metrics (see the module docstring)."""

    def __init__(self, capacity: int = 512, max_metrics: int = 64):
        if capacity < 4 or capacity % 2:
            raise ValueError("capacity must be an even number >= 4")
        self.capacity = capacity
        self.max_metrics = max_metrics
        self.width = 1                       # rows per bucket (a power of two)
        self.size = 0                        # buckets in use
        self.rows = 0                        # rows ever appended (since the last truncate)
        self.lo_step = _nan_array(capacity)
        self.hi_step = _nan_array(capacity)
        self.lo_ts = _nan_array(capacity)
        self.hi_ts = _nan_array(capacity)
        self.count = array("l", [0]) * capacity
        self.cols: dict[str, list[array]] = {}
        self.dropped_metrics: set[str] = set()

    # -- writing --------------------------------------------------------------------------------
    def _column(self, name: str) -> list[array] | None:
        col = self.cols.get(name)
        if col is None:
            if len(self.cols) >= self.max_metrics:
                self.dropped_metrics.add(name)
                return None
            col = [_nan_array(self.capacity) for _ in range(NCOL)]
            for b in range(self.capacity):
                col[BAD][b] = 0.0
            self.cols[name] = col
        return col

    @property
    def last_step(self) -> float:
        return self.hi_step[self.size - 1] if self.size else -math.inf

    def append(self, step: int, ts: float, values: dict[str, float], emas: dict[str, float]) -> None:
        """One row: the metrics of ``step`` (steps must ascend; the caller filters the rest)."""
        b = self.size - 1
        new = b < 0 or self.count[b] >= self.width
        if new:
            if self.size == self.capacity:
                self._compact()
            b = self.size
            self.size += 1
            self.lo_step[b] = step
            self.lo_ts[b] = ts
            self.count[b] = 0
            for name, col in self.cols.items():
                if name not in values:       # absent this step: an empty bucket for it
                    for c in (MIN, MAX, MIN_STEP, MAX_STEP, EMA0, EMA1, LAST):
                        col[c][b] = NAN
                    col[BAD][b] = 0.0
        self.hi_step[b] = step
        self.hi_ts[b] = ts
        self.count[b] += 1
        self.rows += 1
        cols = self.cols
        for name, v in values.items():
            col = cols.get(name) or self._column(name)
            if col is None:
                continue
            e = emas.get(name, NAN)
            col[LAST][b] = v
            col[EMA1][b] = e
            finite = v == v and v != math.inf and v != -math.inf
            if new:
                col[EMA0][b] = e
                if finite:
                    col[MIN][b] = col[MAX][b] = v
                    col[MIN_STEP][b] = col[MAX_STEP][b] = step
                    col[BAD][b] = 0.0
                else:
                    col[MIN][b] = col[MAX][b] = col[MIN_STEP][b] = col[MAX_STEP][b] = NAN
                    col[BAD][b] = 1.0
                continue
            if col[EMA0][b] != col[EMA0][b]:
                col[EMA0][b] = e
            if not finite:
                col[BAD][b] += 1.0
                continue
            mn = col[MIN][b]
            if mn != mn or v < mn:
                col[MIN][b] = v
                col[MIN_STEP][b] = step
            mx = col[MAX][b]
            if mx != mx or v > mx:
                col[MAX][b] = v
                col[MAX_STEP][b] = step

    def _compact(self) -> None:
        """Merge buckets pairwise: half the buckets, each twice as wide."""
        half = self.size // 2
        for i in range(half):
            a, b = 2 * i, 2 * i + 1
            self.lo_step[i], self.hi_step[i] = self.lo_step[a], self.hi_step[b]
            self.lo_ts[i], self.hi_ts[i] = self.lo_ts[a], self.hi_ts[b]
            self.count[i] = self.count[a] + self.count[b]
            for col in self.cols.values():
                _merge_into(col, i, a, b)
        self.size = half
        self.width *= 2

    def truncate_after(self, step: int) -> None:
        """Forget buckets that start after ``step`` (a run rolled back and replays from there)."""
        keep = 0
        while keep < self.size and self.lo_step[keep] <= step:
            keep += 1
        self.size = keep
        if keep and self.hi_step[keep - 1] > step:
            # the bucket straddles the rollback point; keep it whole but allow appends after it
            self.hi_step[keep - 1] = step

    # -- reading --------------------------------------------------------------------------------
    def metrics(self) -> list[str]:
        return list(self.cols)

    def view(self, names: Iterable[str] | None = None, points: int | None = None) -> dict:
        """The history as chart data: ``step``, ``ts`` and per metric ``raw`` and ``ema`` lists.

        ``points`` bounds the number of buckets (each drawn as one or two points); buckets are
        merged ``k`` at a time to get there, extremes kept. Non-finite values are ``None``
        (gaps), and ``bad`` lists the steps of buckets that held a NaN or an infinity.
        """
        names = [n for n in (names if names is not None else self.cols) if n in self.cols]
        k = 1
        if points and points > 0:
            while self.size / k > points:
                k *= 2
        steps: list[float] = []
        tss: list[float] = []
        raw: dict[str, list] = {n: [] for n in names}
        ema: dict[str, list] = {n: [] for n in names}
        bad: dict[str, list] = {n: [] for n in names}
        tmp = [_nan_array(1) for _ in range(NCOL)]
        for start in range(0, self.size, k):
            end = min(start + k, self.size) - 1
            lo_s, hi_s = self.lo_step[start], self.hi_step[end]
            lo_t, hi_t = self.lo_ts[start], self.hi_ts[end]
            single = lo_s == hi_s
            if single:
                steps.append(lo_s)
                tss.append(lo_t)
            else:
                steps.extend((lo_s, hi_s))
                tss.extend((lo_t, hi_t))
            for n in names:
                col = self.cols[n]
                if k == 1:
                    src, at = col, start
                else:
                    for c in range(NCOL):
                        tmp[c][0] = col[c][start]
                    for j in range(start + 1, end + 1):
                        _merge_pair(tmp, 0, col, j)
                    src, at = tmp, 0
                mn, mx = src[MIN][at], src[MAX][at]
                e0, e1 = src[EMA0][at], src[EMA1][at]
                if src[BAD][at] > 0:
                    bad[n].append(hi_s)
                if single:
                    last = src[LAST][at]
                    raw[n].append(last if _finite(last) else None)
                    ema[n].append(e1 if _finite(e1) else None)
                    continue
                if mn != mn:            # nothing finite in the bucket
                    raw[n].extend((None, None))
                elif src[MIN_STEP][at] <= src[MAX_STEP][at]:
                    raw[n].extend((mn, mx))
                else:
                    raw[n].extend((mx, mn))
                ema[n].extend((e0 if _finite(e0) else None, e1 if _finite(e1) else None))
        return {"step": steps, "ts": tss, "raw": raw, "ema": ema,
                "bad": {n: v for n, v in bad.items() if v}, "bucket_steps": self.width * k}


def _merge_pair(dst: list[array], i: int, col: list[array], j: int) -> None:
    """Fold bucket ``j`` of ``col`` (later in time) into bucket ``i`` of ``dst``."""
    mn2, mx2 = col[MIN][j], col[MAX][j]
    if mn2 == mn2 and (dst[MIN][i] != dst[MIN][i] or mn2 < dst[MIN][i]):
        dst[MIN][i], dst[MIN_STEP][i] = mn2, col[MIN_STEP][j]
    if mx2 == mx2 and (dst[MAX][i] != dst[MAX][i] or mx2 > dst[MAX][i]):
        dst[MAX][i], dst[MAX_STEP][i] = mx2, col[MAX_STEP][j]
    if dst[EMA0][i] != dst[EMA0][i]:
        dst[EMA0][i] = col[EMA0][j]
    if col[EMA1][j] == col[EMA1][j]:
        dst[EMA1][i] = col[EMA1][j]
    if col[LAST][j] == col[LAST][j] or col[BAD][j] > 0:
        dst[LAST][i] = col[LAST][j]
    dst[BAD][i] += col[BAD][j]


def _merge_into(col: list[array], i: int, a: int, b: int) -> None:
    """Bucket ``i`` := merge(bucket ``a``, bucket ``b``) in place (``i <= a < b``)."""
    for c in range(NCOL):
        col[c][i] = col[c][a]
    _merge_pair(col, i, col, b)
