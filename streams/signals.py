"""Derived signals of a metric series, built from the statistics layer. Pure.

A :class:`Signal` turns one metric's values, step by step, into the number a rule compares
(``signal: ema``, ``signal: robust_z`` ...). A :class:`SignalBank` holds the signals one rank of
one run needs, keyed by ``(metric, signal, window, cycle_metric)``; it is created from the
leaf conditions of the rule pack, updated once per step event, read by the rule engine, and
serialised with the run's state.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

from streams import stats as S

__all__ = ["Signal", "SignalBank", "SignalKey", "make_signal"]

SignalKey = tuple  # (metric, signal, window, cycle_metric, smooth)

#: values in a "level" (the median that stands for the current value in level comparisons)
LEVEL_K = 5


def _median(xs) -> float:
    v = sorted(xs)
    n = len(v)
    if n == 0:
        return math.nan
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def _nan_none(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _none_nan(x):
    return math.nan if x is None else x


class Signal:
    """One derived signal. ``update`` takes the new value (finite) and the step's metrics."""

    kind = "value"

    def __init__(self, window: int, stat: S.Statistic | None = None):
        self.window = window
        self.stat = stat
        self.out = math.nan

    def update(self, x: float, metrics: dict[str, float]) -> None:
        self.out = x
        if self.stat is not None:
            self.stat.update(x)

    def get(self) -> float:
        return self.out

    def to_state(self) -> dict:
        return {"kind": self.kind, "window": self.window, "out": _nan_none(self.out),
                "stat": None if self.stat is None else self.stat.to_state(), **self._extra()}

    def _extra(self) -> dict:
        return {}

    def _load(self, state: dict) -> None:
        self.out = _none_nan(state.get("out"))
        if state.get("stat") is not None:
            self.stat = S.stat_from_state(state["stat"])


class _StatSignal(Signal):
    """The signal is ``read(stat)`` after the stat took the value."""

    def __init__(self, kind: str, window: int, stat: S.Statistic, read: Callable):
        super().__init__(window, stat)
        self.kind, self.read = kind, read

    def update(self, x, metrics):
        self.stat.update(x)
        self.out = self.read(self.stat)


class _BeforeSignal(Signal):
    """The signal compares the new value with the stat of the values *before* it."""

    def __init__(self, kind: str, window: int, stat: S.Statistic, combine: Callable):
        super().__init__(window, stat)
        self.kind, self.combine = kind, combine

    def update(self, x, metrics):
        base = self.stat.get()
        self.out = self.combine(x, base)
        self.stat.update(x)


class _Delta(Signal):
    kind = "delta"

    def __init__(self, window: int):
        super().__init__(window)
        self.prev = math.nan

    def update(self, x, metrics):
        self.out = x - self.prev if math.isfinite(self.prev) else math.nan
        self.prev = x

    def _extra(self):
        return {"prev": _nan_none(self.prev)}

    def _load(self, state):
        super()._load(state)
        self.prev = _none_nan(state.get("prev"))


class _CycleRise(Signal):
    """Rise of the value since the first value of its update cycle (``cycle_metric`` restarts)."""

    kind = "cycle_rise"

    def __init__(self, window: int, cycle_metric: str):
        super().__init__(window)
        self.cycle_metric = cycle_metric
        self.start = math.nan
        self.last_cycle = math.nan

    def update(self, x, metrics):
        c = metrics.get(self.cycle_metric, math.nan)
        if not math.isfinite(self.start) or (math.isfinite(c) and math.isfinite(self.last_cycle)
                                             and c <= self.last_cycle):
            self.start = x
        self.last_cycle = c
        self.out = x - self.start

    def _extra(self):
        return {"start": _nan_none(self.start), "last_cycle": _nan_none(self.last_cycle),
                "cycle_metric": self.cycle_metric}

    def _load(self, state):
        super()._load(state)
        self.start = _none_nan(state.get("start"))
        self.last_cycle = _none_nan(state.get("last_cycle"))


def _ratio(x: float, base: float) -> float:
    if not math.isfinite(base):
        return math.nan
    if base == 0:
        return math.inf if x > 0 else (1.0 if x == 0 else -math.inf)
    return x / base


class _RatioToStart(Signal):
    """The current level over the level of the run's start.

    Both levels are medians (of the first ``window`` values, frozen, and of the last
    :data:`LEVEL_K` values), so single-step spikes move neither.
    """

    kind = "ratio_to_start"

    def __init__(self, window: int):
        super().__init__(window, S.WarmupBaseline(window))
        self.recent: deque = deque(maxlen=LEVEL_K)

    def update(self, x, metrics):
        frozen = self.stat.frozen
        self.stat.update(x)
        self.recent.append(x)
        self.out = _ratio(_median(self.recent), self.stat.median) if frozen else math.nan

    def _extra(self):
        return {"recent": list(self.recent)}

    def _load(self, state):
        super()._load(state)
        self.recent = deque(state.get("recent", []), maxlen=LEVEL_K)


class _Window(Signal):
    """Signals computed from the raw window of values (levels and trends)."""

    def __init__(self, kind: str, window: int):
        super().__init__(window)
        self.kind = kind
        self.values: deque = deque(maxlen=window)

    def update(self, x, metrics):
        self.values.append(x)
        self.out = math.nan  # computed lazily in get()
        self._cache = None

    def get(self):
        if getattr(self, "_cache", None) is not None:
            return self._cache
        v = list(self.values)
        out = math.nan
        if self.kind == "level_change" and len(v) >= max(2 * LEVEL_K, self.window // 2):
            k = max(LEVEL_K, len(v) // 10)
            out = _ratio(_median(v[-k:]), _median(v[:k])) - 1.0
        elif self.kind == "rel_trend" and len(v) >= max(10, self.window // 2):
            # least-squares slope (the input is usually smoothed already; Theil-Sen here
            # would cost a quadratic number of pairwise slopes per step)
            n = len(v)
            t_mean = (n - 1) / 2.0
            x_mean = sum(v) / n
            cov = sum((i - t_mean) * (x - x_mean) for i, x in enumerate(v))
            var_t = n * (n * n - 1) / 12.0
            out = (cov / var_t) * n / max(abs(_median(v)), 1e-12)
        self._cache = out
        return out

    def _extra(self):
        return {"values": list(self.values)}

    def _load(self, state):
        super()._load(state)
        self.values = deque(state.get("values", []), maxlen=self.window)


class _Smoothed(Signal):
    """Any signal, fed the EMA of the metric instead of the raw values."""

    def __init__(self, inner: Signal, span: int):
        super().__init__(inner.window, S.EMA(span=span))
        self.inner, self.span, self.kind = inner, span, inner.kind

    def update(self, x, metrics):
        self.stat.update(x)
        self.inner.update(self.stat.get(), metrics)

    def get(self):
        return self.inner.get()

    def to_state(self):
        return {"smooth": self.span, "ema": self.stat.to_state(), "inner": self.inner.to_state()}


def _trend(st, attr: str) -> float:
    """A trend statistic; a constant window (all ties) has no trend: 0, not undefined."""
    value = float(getattr(st, attr))
    if math.isnan(value) and st.n >= 3:
        return 0.0
    return value


def make_signal(signal: str, window: int, cycle_metric: str | None = None,
                smooth: int | None = None) -> Signal:
    """A fresh signal of the given kind (names as in :mod:`rules.schema`)."""
    if smooth:
        return _Smoothed(make_signal(signal, window, cycle_metric), smooth)
    w = window
    if signal == "value":
        return Signal(w)
    if signal == "ema":
        return _StatSignal("ema", w, S.EMA(span=w), lambda st: st.get())
    simple = {"mean": S.RollingMean, "std": S.RollingStd, "median": S.RollingMedian,
              "min": S.RollingMin, "max": S.RollingMax}
    if signal in simple:
        return _StatSignal(signal, w, simple[signal](w), lambda st: st.get())
    if signal == "zscore":
        return _StatSignal(signal, w, S.ZScore(w, min_periods=min(w, max(5, w // 4))), lambda st: st.get())
    if signal == "robust_z":
        return _StatSignal(signal, w, S.RobustZ(w, min_periods=min(w, max(5, w // 4))), lambda st: st.get())
    if signal == "ratio_to_median":
        return _BeforeSignal(signal, w, S.RollingMedian(w), _ratio)
    if signal == "ratio_to_start":
        return _RatioToStart(w)
    if signal == "rel_drop":
        return _StatSignal(signal, w, S.RelativeDrop(w), lambda st: st.get())
    if signal == "rel_rise":
        return _StatSignal(signal, w, S.RelativeRise(w), lambda st: st.get())
    if signal in ("trend_z", "trend_tau", "slope"):
        attr = {"trend_z": "z", "trend_tau": "tau", "slope": "slope"}[signal]
        return _StatSignal(signal, w, S.MannKendall(w), lambda st, a=attr: _trend(st, a))
    if signal in ("rel_trend", "level_change"):
        return _Window(signal, w)
    if signal == "flat_range":
        return _StatSignal(signal, w, S.Flatline(w, rel_tol=0.01), lambda st: st.get())
    if signal == "autocorr":
        return _StatSignal(signal, w, S.Autocorrelation(w, max_lag=max(2, w // 2)),
                           lambda st: st.get())
    if signal == "sign_flip_rate":
        return _StatSignal(signal, w, S.SignFlipRate(w), lambda st: st.get())
    if signal == "diff_ratio":
        return _StatSignal(signal, w, S.SignFlipRate(w), lambda st: float(st.diff_std_ratio))
    if signal == "delta":
        return _Delta(w)
    if signal == "cycle_rise":
        return _CycleRise(w, cycle_metric or "ppo/epoch")
    raise ValueError(f"unknown signal {signal!r}")


def _restore(state: dict, cycle_metric: str | None) -> Signal:
    if "smooth" in state:
        sig = _Smoothed(_restore(state["inner"], cycle_metric), state["smooth"])
        sig.stat = S.stat_from_state(state["ema"])
        return sig
    sig = make_signal(state["kind"], state["window"], cycle_metric)
    sig._load(state)
    return sig


class SignalBank:
    """The signals of one rank of one run."""

    def __init__(self, keys: list[SignalKey]):
        self.keys = sorted(set(keys), key=str)
        self.by_metric: dict[str, list[tuple[SignalKey, Signal]]] = {}
        self.signals: dict[SignalKey, Signal] = {}
        self.seen: dict[str, int] = {}
        for key in self.keys:
            metric, signal, window, cycle, smooth = key
            sig = make_signal(signal, window, cycle, smooth)
            self.signals[key] = sig
            self.by_metric.setdefault(metric, []).append((key, sig))

    def update(self, metrics: dict[str, float]) -> None:
        """Feed one step's metrics (non-finite values are skipped by every signal)."""
        for metric, x in metrics.items():
            entries = self.by_metric.get(metric)
            if entries is None or not math.isfinite(x):
                continue
            self.seen[metric] = self.seen.get(metric, 0) + 1
            for _, sig in entries:
                sig.update(x, metrics)

    def get(self, key: SignalKey, current: dict[str, float]) -> tuple[float, int, bool]:
        metric = key[0]
        logged = metric in current
        sig = self.signals.get(key)
        if sig is None:
            return math.nan, 0, logged
        x = current.get(metric, math.nan)
        if logged and not math.isfinite(x):
            return x, self.seen.get(metric, 0), logged
        return sig.get(), self.seen.get(metric, 0), logged

    def to_state(self) -> dict:
        return {"seen": self.seen,
                "signals": [[list(k), s.to_state()] for k, s in self.signals.items()]}

    def load(self, state: dict) -> None:
        """Restore values into the signals this bank was built with (others are dropped)."""
        self.seen = dict(state.get("seen", {}))
        for key, sig_state in state.get("signals", []):
            key = tuple(key)
            if key in self.signals:
                restored = _restore(sig_state, key[3])
                self.signals[key] = restored
                self.by_metric[key[0]] = [(k, restored if k == key else s)
                                          for k, s in self.by_metric[key[0]]]
