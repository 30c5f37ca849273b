"""Per-sample distributions of a run over time, bounded (pure).

Each step event may carry ``dists`` (e.g. 64 per-sample rewards and response lengths).
:class:`DistHistory` keeps

* the latest step's values (for the "latest histogram"), and
* one column per step of 33 quantiles (q0, q1/32, ..., q1), at most ``capacity`` columns; when
  full, neighbouring columns are merged (quantiles averaged, the extremes kept as min and max),
  so the history covers the whole run at a coarser step.

:func:`heatmap` turns the columns into a histogram-over-steps matrix on common bins: each of
the 32 quantile intervals holds 1/32 of the mass, spread uniformly over the interval.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DistHistory", "heatmap", "histogram"]

QUANTILES = np.linspace(0.0, 1.0, 33)
MAX_LATEST = 4096


class DistHistory:
    def __init__(self, capacity: int = 240):
        if capacity < 4 or capacity % 2:
            raise ValueError("capacity must be an even number >= 4")
        self.capacity = capacity
        self.steps: list[int] = []
        self.ts: list[float] = []
        self.q: list[np.ndarray] = []
        self.width = 1            # steps merged per column
        self._pending = 0         # rows folded into the open column so far
        self.latest: list[float] = []
        self.latest_step: int | None = None

    def add(self, step: int, ts: float, values: list[float]) -> None:
        arr = np.asarray(values, dtype=float)
        arr = arr[np.isfinite(arr)]
        if arr.size == 0:
            return
        if arr.size > MAX_LATEST:
            arr = arr[:: math.ceil(arr.size / MAX_LATEST)]
        self.latest = arr.tolist()
        self.latest_step = step
        # linear-interpolated quantiles (numpy's default method), without np.quantile's overhead
        arr = np.sort(arr)
        q = np.interp(QUANTILES * (arr.size - 1), np.arange(arr.size), arr)
        if self.q and self._pending < self.width:
            self._fold(step, ts, q)
            return
        if len(self.q) >= self.capacity:
            self._compact()
        self.steps.append(step)
        self.ts.append(ts)
        self.q.append(q)
        self._pending = 1

    def _fold(self, step: int, ts: float, q: np.ndarray) -> None:
        n = self._pending
        prev = self.q[-1]
        merged = (prev * n + q) / (n + 1)
        merged[0] = min(prev[0], q[0])
        merged[-1] = max(prev[-1], q[-1])
        self.q[-1], self.steps[-1], self.ts[-1] = merged, step, ts
        self._pending += 1

    def _compact(self) -> None:
        q, steps, ts = [], [], []
        for i in range(0, len(self.q) - 1, 2):
            a, b = self.q[i], self.q[i + 1]
            m = (a + b) / 2.0
            m[0], m[-1] = min(a[0], b[0]), max(a[-1], b[-1])
            q.append(m)
            steps.append(self.steps[i + 1])
            ts.append(self.ts[i + 1])
        self.q, self.steps, self.ts = q, steps, ts
        self.width *= 2
        # the last column is now a full merged pair: the next row opens a new one
        self._pending = self.width

    def truncate_after(self, step: int) -> None:
        keep = sum(1 for s in self.steps if s <= step)
        del self.steps[keep:], self.ts[keep:], self.q[keep:]
        self._pending = self.width


def histogram(values: list[float], bins: int = 30) -> dict:
    """Counts of ``values`` on ``bins`` equal bins: ``{edges, counts}`` (empty when no data)."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {"edges": [], "counts": []}
    lo, hi = float(arr.min()), float(arr.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(arr, bins=bins, range=(lo, hi))
    return {"edges": [round(float(e), 6) for e in edges], "counts": counts.tolist()}


def heatmap(hist: DistHistory, bins: int = 30) -> dict:
    """Histogram-over-steps of the quantile columns: ``{steps, ts, edges, density}``.

    ``density[i][j]`` is the fraction of column ``i``'s mass in bin ``j``; the bins span the
    whole history (its q0 .. q1 range), so shifts of the distribution show as a moving band.
    """
    if not hist.q:
        return {"steps": [], "ts": [], "edges": [], "density": [], "median": []}
    Q = np.vstack(hist.q)                                  # (columns, 33)
    lo, hi = float(Q[:, 0].min()), float(Q[:, -1].max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    # cumulative mass at each edge for each column: piecewise-linear CDF through the quantiles
    levels = QUANTILES
    cdf = np.empty((Q.shape[0], bins + 1))
    for i in range(Q.shape[0]):
        qi = np.maximum.accumulate(Q[i])
        # np.interp needs increasing x; equal quantiles (point masses) jump at that value
        cdf[i] = np.interp(edges, qi, levels, left=0.0, right=1.0)
    density = np.clip(np.diff(cdf, axis=1), 0.0, 1.0)
    return {
        "steps": list(hist.steps),
        "ts": list(hist.ts),
        "edges": [round(float(e), 6) for e in edges],
        "density": np.round(density, 4).tolist(),
        "median": [round(float(q[16]), 6) for q in hist.q],
    }
