"""The signals rules read, in training steps, for one rank of one run. Pure.

A :class:`Track` is one metric of one rank (optionally EMA-smoothed): its points ``(step,
value)`` of the last steps, kept as long as the widest window on it needs (in steps, and at
least as many points as the most demanding signal on it needs). A push per logged value is the
only work done on every step.

A :class:`Window` is a rolling window of W steps over a track, shared by every signal that reads
the same (metric, smooth, window). It catches up with its track only when a rule reads it
(lazily; a window nobody reads this step costs nothing), keeps a sorted copy of its values when
a median, a quantile or a trend needs one, and the Mann-Kendall S statistic in O(log n) per
point. Everything a window holds is a function of its track's points, so a restored run state
rebuilds it exactly.

A :class:`Bank` holds the tracks and windows of one rank and is the
:class:`rules.compile.Source` the compiled rules read (see :func:`Bank.metric`); the other
sources (dists, ranks, groups, samples, liveness) are answered from the run state.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left, bisect_right, insort
from collections import deque
from itertools import islice
from operator import mul, sub
from typing import Any, Callable

import msgspec

__all__ = ["Bank", "Track", "Window", "median_of", "rewind_state"]

NAN = math.nan
#: points of the "current level" (ratio_to_start): those of the last LEVEL_STEPS steps, and at
#: least LEVEL_POINTS of them, so one spike moves neither the level nor the baseline
LEVEL_STEPS = 5
LEVEL_POINTS = 3
#: points of a run's start that make a baseline, at least
BASELINE_POINTS = 3
#: the steps of a run's start whose median shift_gain measures the run's gain from
START_STEPS = 20
#: a metric first logged after this step was first watched mid-training (a run resumed, or a
#: monitor attached late): its "start" is wherever it then was, and what it had gained before
#: is unknown; the gain signals count at least RESUMED_LEVEL_SHARE of that start's level as
#: its gain (see gain_unit)
RESUMED_AFTER_STEP = 40
RESUMED_LEVEL_SHARE = 0.5


def median_of(sorted_values: list[float]) -> float:
    n = len(sorted_values)
    if n == 0:
        return NAN
    h = n // 2
    return sorted_values[h] if n % 2 else 0.5 * (sorted_values[h - 1] + sorted_values[h])


#: an EMA over N steps averages at least the points a run logged every EMA_POINT_STEPS steps
#: has in N steps: a run that logs every 64 steps (its steps count samples) is averaged by
#: `smooth: 50` as an EMA of 2.5 points, not read at its last point alone. Runs logged every
#: 20 steps or less are averaged over steps exactly as before; a floor of 10 steps (5 points)
#: cost noisy simulated collapses logged every 20 steps 2 of 12 catches in two seed sets.
EMA_POINT_STEPS = 20


def ema_floor(span: int) -> float:
    """The least decay per logged point of an EMA of ``span`` steps (0 for spans of at most
    EMA_POINT_STEPS steps): that of an EMA of ``span / EMA_POINT_STEPS`` points."""
    points = span / EMA_POINT_STEPS
    return 1.0 - 2.0 / (points + 1.0) if points > 1.0 else 0.0


#: 1.4826 x MAD estimates the standard deviation of normal data
MAD_SCALE = 1.4826
#: points of the reference a change-point signal (shift_z, level_ratio) needs before it
SPLIT_REF_POINTS = 12
#: the fewest points of each block jump_t compares (a window of 24 points): the means of 4
#: points of a run logged every 5 or 10 steps, over a quarter of a window stretched to 80-160
#: steps, read a healthy reward's wander as a crash
JUMP_BLOCK_POINTS = 6


#: sqrt(pi / 2): the mean absolute deviation of normal data x this is its standard deviation
MEAN_AD_SCALE = 1.2533


def robust_scale(values: list[float], med: float) -> float:
    """The spread of ``values`` around their median ``med``: 1.4826 x the median absolute
    deviation, but never less than 1.2533 x the mean absolute deviation (both estimate the
    standard deviation of normal data). The MAD alone is 0 when more than half the values are
    equal -- rewards that are mostly exactly 0 with some successes -- and would make any
    change look infinitely significant.
    Nor less than the smallest deviation that is not 0: the data's resolution. A reward of one
    group of four answers a step moves in quarters, mostly repeated; both estimates then read a
    small fraction of a quarter, and a dip of three quarters for two points read as 4 of its
    noise (a healthy shape history alarmed as a crash). Continuous data have deviations far
    smaller than their spread, so this floor leaves them alone."""
    dev = [abs(v - med) for v in values]
    if not dev:
        return NAN
    q = min((x for x in dev if x != 0.0), default=0.0)
    return max(MAD_SCALE * median_of(sorted(dev)), MEAN_AD_SCALE * sum(dev) / len(dev), q)


def _frozen_baseline(pts: list[float]) -> tuple[float, float, int, float, float]:
    """(median, robust scale, points, maximum, robust scale of the point-to-point changes) of a
    run's first points."""
    srt = sorted(pts)
    med = median_of(srt)
    return med, robust_scale(srt, med), len(srt), srt[-1], diff_scale(pts)


def diff_scale(values) -> float:
    """Robust scale of the point-to-point changes of ``values`` (in order): the noise, without
    the trend."""
    v = list(values)
    d = [b - a for a, b in zip(v, v[1:])]
    if len(d) < 2:
        return NAN
    return robust_scale(d, median_of(sorted(d)))


def _sample_std(values: list[float]) -> float:
    """The sample standard deviation of ``values`` (two passes, summed in order)."""
    m = len(values)
    c = 0.0
    for x in values:
        c += x
    c /= m
    v = 0.0
    for x in values:
        v += (x - c) * (x - c)
    return math.sqrt(v / (m - 1))


def _trimmed_sum(values) -> float:
    """The sum of ``values`` without their lowest and highest one (in sorted order)."""
    srt = sorted(values)
    t = 0.0
    for x in srt[1:-1]:
        t += x
    return t


def _zscore(x: float, center: float, scale: float) -> float:
    """(x - center) / scale; +-inf when the scale is 0 and x differs (a change from a constant)."""
    if x != x or center != center or scale != scale:
        return NAN
    floor = 1e-9 * abs(center)
    if scale > floor:
        return (x - center) / scale
    d = x - center
    if abs(d) <= floor:
        return 0.0
    return math.copysign(math.inf, d)


def _ratio(x: float, base: float) -> float:
    if base != base:
        return NAN
    if base == 0:
        return math.inf if x > 0 else (1.0 if x == 0 else -math.inf)
    return x / base


def _enc(x: float) -> Any:
    return x if x == x and x not in (math.inf, -math.inf) else None if x != x else str(x)


def _dec(x: Any) -> float:
    return NAN if x is None else float(x)


class Track:
    """One metric (raw or EMA-smoothed) of one rank."""

    __slots__ = ("metric", "smooth", "keep_steps", "keep_points", "steps", "values", "total",
                 "first_step", "n", "last_step", "cur", "alpha", "num", "den", "prev_step",
                 "floor", "baselines", "ema_spans", "emas")

    def __init__(self, metric: str, smooth: int | None):
        self.metric, self.smooth = metric, smooth
        self.keep_steps, self.keep_points = 1, 1
        self.steps: deque[int] = deque()
        self.values: deque[float] = deque()
        self.total = 0                 # points ever pushed (windows sync against it)
        self.first_step: int | None = None
        self.n = 0                     # finite values seen
        self.last_step: int | None = None   # step of the last logged value (finite or not)
        self.cur = NAN                 # that raw value
        self.alpha = 2.0 / (smooth + 1.0) if smooth else 0.0
        self.floor = ema_floor(smooth) if smooth else 0.0
        self.num = self.den = 0.0
        self.prev_step: int | None = None
        self.baselines: dict[int, list] = {}    # window -> [points..] or [median] once frozen
        self.ema_spans: list[int] = []          # `signal: ema` spans read on this track
        self.emas: dict[int, list[float]] = {}  # span -> [num, den]

    def need(self, steps: int, points: int) -> None:
        self.keep_steps = max(self.keep_steps, steps)
        self.keep_points = max(self.keep_points, points)

    def push(self, step: int, x: float) -> None:
        self.last_step, self.cur = step, x
        if x - x != 0.0:       # NaN or infinite: shown to the rules, kept out of the statistics
            return
        prev = self.prev_step
        gap = 1 if prev is None or step - prev <= 1 else step - prev
        self.prev_step = step
        if self.first_step is None:
            self.first_step = step
        self.n += 1
        if self.ema_spans:
            for span in self.ema_spans:
                e = self.emas.get(span)
                if e is None:
                    e = self.emas[span] = [0.0, 0.0]
                decay = (1.0 - 2.0 / (span + 1.0)) ** gap
                if gap > 1:
                    decay = max(decay, ema_floor(span))
                e[0] = decay * e[0] + (1.0 - decay) * x
                e[1] = decay * e[1] + (1.0 - decay)
        if self.alpha:
            decay = 1.0 - self.alpha if gap == 1 else max((1.0 - self.alpha) ** gap, self.floor)
            self.num = decay * self.num + (1.0 - decay) * x
            self.den = decay * self.den + (1.0 - decay)
            x = self.num / self.den
        if self.baselines:
            for window, pts in self.baselines.items():
                if len(pts) != 1 or not isinstance(pts[0], tuple):
                    if step < self.first_step + window or len(pts) < BASELINE_POINTS:
                        pts.append(x)
                    else:   # frozen: the median (and MAD scale) of the run's first points
                        pts[:] = [_frozen_baseline(pts)]
        steps = self.steps
        steps.append(step)
        self.values.append(x)
        self.total += 1
        if len(steps) > self.keep_points and steps[0] <= step - self.keep_steps:
            edge, values, keep = step - self.keep_steps, self.values, self.keep_points
            while len(steps) > keep and steps[0] <= edge:
                steps.popleft()
                values.popleft()

    def ema(self, span: int) -> float:
        e = self.emas.get(span)
        return e[0] / e[1] if e and e[1] > 0 else NAN

    def smoothed(self) -> float:
        return self.num / self.den if self.den > 0 else NAN

    def baseline(self, window: int) -> float:
        """Median of the run's first ``window`` steps (at least 3 points); NaN until then."""
        pts = self.baselines.get(window)
        if pts and len(pts) == 1 and isinstance(pts[0], tuple):
            return pts[0][0]
        return NAN

    def baseline_stat(self, window: int, i: int) -> float:
        """Of the run's first ``window`` steps: 1 robust scale, 2 points, 3 maximum, 4 robust
        scale of the point-to-point changes; NaN until they are known."""
        pts = self.baselines.get(window)
        if pts and len(pts) == 1 and isinstance(pts[0], tuple) and len(pts[0]) > i:
            return pts[0][i]
        return NAN

    def gain_unit(self, ref: float) -> float:
        """The unit of the gain signals (shift_gain, drawdown_gain, trend_gain) at the level
        ``ref``: what the metric moved from its start (its first START_STEPS steps) to ``ref``,
        plus that start's spread. A metric first watched mid-training (its first step after
        RESUMED_AFTER_STEP) started on a plateau whose own noise is no measure of what the run
        had learnt: there the unit is at least RESUMED_LEVEL_SHARE of the start's level."""
        start = self.baseline(START_STEPS)
        unit = abs(ref - start) + self.baseline_stat(START_STEPS, 1)
        if self.first_step is not None and self.first_step > RESUMED_AFTER_STEP:
            floor = RESUMED_LEVEL_SHARE * abs(start)
            if floor > unit:
                return floor
        return unit

    def to_state(self) -> dict:
        return {"steps": list(self.steps), "values": [_enc(v) for v in self.values],
                "total": self.total, "first": self.first_step, "n": self.n,
                "last": self.last_step, "cur": _enc(self.cur), "num": self.num, "den": self.den,
                "prev": self.prev_step,
                "base": {str(w): ([{"m": p[0][0], "s": [_enc(x) for x in p[0][1:]]}] if len(p) == 1
                                  and isinstance(p[0], tuple) else p)
                         for w, p in self.baselines.items()},
                "emas": {str(k): v for k, v in self.emas.items()}}

    def load(self, st: dict) -> None:
        self.steps = deque(st["steps"])
        self.values = deque(_dec(v) for v in st["values"])
        self.total, self.first_step, self.n = st["total"], st["first"], st["n"]
        self.last_step, self.cur = st["last"], _dec(st["cur"])
        self.num, self.den, self.prev_step = st["num"], st["den"], st["prev"]
        for w, p in st.get("base", {}).items():
            if int(w) in self.baselines:
                self.baselines[int(w)] = ([(p[0]["m"], *(_dec(x) for x in p[0].get("s", ())))]
                                          if len(p) == 1 and isinstance(p[0], dict) else list(p))
        for k, v in st.get("emas", {}).items():
            self.emas[int(k)] = list(v)


def _ema_over(span: int, steps: list, values: list) -> list[float]:
    """``[num, den]`` of a ``signal: ema`` of ``span`` steps over these points (a track's kept
    ones, raw), pushed through a fresh track as the run's own pushed them."""
    trk = Track("", None)
    trk.ema_spans.append(span)
    for step, v in zip(steps, values):
        trk.push(step, _dec(v))
    return trk.emas.get(span, [0.0, 0.0])


def rewind_state(state: dict, last: int) -> dict:
    """A bank's ``to_state()`` (the native bank's or this module's: the same data) without the
    points of the steps after ``last``: the run went back to a checkpoint of step ``last`` (a
    rollback, a relaunch that resumed it), and those points belong to the timeline it left. The
    warm-up baselines of the run's start stay; a track with no point left starts over. An EMA is
    taken back to its last kept value (its weight as it was); a ``signal: ema`` of a metric is
    worked out again over the points its track keeps (:func:`_ema_over`); a learning rate's
    ramp stays as it was, and the autocorrelations are worked out again."""
    tracks = []
    for m, smooth, t in state.get("tracks", []):
        steps = t["steps"]
        keep = len(steps)
        while keep and steps[keep - 1] > last:
            keep -= 1
        dropped = len(steps) - keep
        if dropped == 0 and (t["last"] is None or t["last"] <= last):
            tracks.append([m, smooth, t])
            continue
        if keep == 0 and (t["first"] is None or t["first"] > last or dropped >= t["n"]):
            continue                       # nothing of it before the checkpoint: it starts over
        t = dict(t)
        t["steps"], t["values"] = steps[:keep], t["values"][:keep]
        t["total"] -= dropped
        t["n"] -= dropped
        if keep:
            t["last"] = t["prev"] = steps[keep - 1]
            t["cur"] = t["values"][-1]
            if smooth and t["den"]:
                t["num"] = _dec(t["values"][-1]) * t["den"]
            if not smooth and t.get("emas"):
                t["emas"] = {k: _ema_over(int(k), t["steps"], t["values"]) for k in t["emas"]}
        else:                              # (the kept points were trimmed off the window)
            t["last"] = t["prev"] = last
            if t.get("emas"):              # (nothing left to work a `signal: ema` out of)
                t["emas"] = {k: [0.0, 0.0] for k in t["emas"]}
        t["base"] = {w: (p if len(p) == 1 and isinstance(p[0], dict) else p[:max(0, t["n"])])
                     for w, p in t.get("base", {}).items()}
        tracks.append([m, smooth, t])
    return {**state, "tracks": tracks, "autocorr": []}


class Window:
    """The points of the last ``steps`` steps of a track (at least ``points`` of them)."""

    __slots__ = ("track", "steps_w", "points", "st", "xs", "synced", "sorted", "mk", "s",
                 "tv", "tp", "cache_at", "cache", "sums", "c", "t0", "s1", "s2", "st1", "stt",
                 "std")

    def __init__(self, track: Track, steps: int, points: int):
        self.track, self.steps_w, self.points = track, steps, points
        self.st: deque[int] = deque()
        self.xs: deque[float] = deque()
        self.synced = 0
        self.sorted: list[float] | None = None
        self.mk = False
        self.s = self.tv = self.tp = 0      # Mann-Kendall S and tie sums
        self.cache_at = -1
        self.cache: dict = {}
        # running sums of d = x - c and t = step - t0 (shifted: no cancellation), when needed
        self.sums = False
        self.c = self.s1 = self.s2 = self.std = 0.0
        self.t0 = self.st1 = self.stt = 0

    def need_sums(self) -> None:
        if not self.sums:
            self.sums = True
            self.synced = 0

    def need_sorted(self) -> None:
        if self.sorted is None:
            self.sorted = []
            self.synced = 0   # rebuild on the next read

    def need_mk(self) -> None:
        self.need_sorted()
        self.mk = True

    def sync(self) -> "Window":
        """Catch up with the track (only the points pushed since the last read)."""
        trk = self.track
        pending = trk.total - self.synced
        if not pending:
            return self
        if pending == 1 and self.synced:
            self._add(trk.steps[-1], trk.values[-1])
        else:
            steps, values = trk.steps, trk.values
            have = len(steps)
            if pending > have or not self.synced:
                self.st.clear()
                self.xs.clear()
                if self.sorted is not None:
                    self.sorted = []
                self.s = self.tv = self.tp = 0
                pending = have
            for i in range(have - pending, have):
                self._add(steps[i], values[i])
        self.synced = trk.total
        if self.sums and (pending > 1 or not trk.total & 127):
            self._resum()   # from scratch now and then: rounding never builds up
        return self

    def _resum(self) -> None:
        st, xs = self.st, self.xs
        if not xs:
            self.s1 = self.s2 = self.std = 0.0
            self.st1 = self.stt = 0
            return
        self.c, self.t0 = xs[0], st[0]
        d = [x - self.c for x in xs]
        t = [s - self.t0 for s in st]
        self.s1, self.s2 = sum(d), sum(map(mul, d, d))
        self.st1, self.stt, self.std = sum(t), sum(map(mul, t, t)), sum(map(mul, t, d))

    def _add(self, step: int, x: float) -> None:
        st, xs, srt = self.st, self.xs, self.sorted
        edge = step - self.steps_w
        sums = self.sums
        while st and st[0] <= edge and len(st) >= self.points:
            ot = st.popleft()
            old = xs.popleft()
            if sums:
                d, t = old - self.c, ot - self.t0
                self.s1 -= d
                self.s2 -= d * d
                self.st1 -= t
                self.stt -= t * t
                self.std -= t * d
            if srt is not None:
                lo = bisect_left(srt, old)
                del srt[lo]
                if self.mk:
                    hi = bisect_right(srt, old, lo)
                    self.s -= (len(srt) - hi) - lo
                    c = hi - lo
                    self.tv -= 6 * c * (c + 2)
                    self.tp -= c
        if srt is not None:
            if self.mk:
                lo = bisect_left(srt, x)
                hi = bisect_right(srt, x, lo)
                c = hi - lo
                self.s += lo - (len(srt) - hi)
                self.tv += 6 * c * (c + 2)
                self.tp += c
                srt.insert(hi, x)
            else:
                insort(srt, x)
        if sums:
            if not st:
                self.c, self.t0 = x, step
                self.s1 = self.s2 = self.std = 0.0
                self.st1 = self.stt = 0
            d, t = x - self.c, step - self.t0
            self.s1 += d
            self.s2 += d * d
            self.st1 += t
            self.stt += t * t
            self.std += t * d
        st.append(step)
        xs.append(x)

    # -- reads (after sync) -------------------------------------------------------------------
    def median(self) -> float:
        return median_of(self.sorted)

    def median_before(self) -> float:
        """Median of the window without its newest point."""
        srt, n = self.sorted, len(self.sorted) - 1
        if n < 1:
            return NAN
        p = bisect_left(srt, self.xs[-1])

        def at(k):
            return srt[k] if k < p else srt[k + 1]
        h = n // 2
        return at(h) if n % 2 else 0.5 * (at(h - 1) + at(h))

    def mean_std(self, skip_last: bool = False) -> tuple[float, float]:
        """Mean and sample std of the window (without its newest point: ``skip_last``)."""
        n = len(self.xs)
        s1, s2 = self.s1, self.s2
        if skip_last:
            d = self.xs[-1] - self.c
            n, s1, s2 = n - 1, s1 - d, s2 - d * d
        if n < 2:
            return (self.c + s1 if n == 1 else NAN), NAN
        var = (s2 - s1 * s1 / n) / (n - 1)
        return self.c + s1 / n, math.sqrt(var) if var > 0 else 0.0

    def trend_z(self) -> float:
        n = len(self.xs)
        if n < 3:
            return NAN
        v = n * (n - 1) * (2 * n + 5) - self.tv
        if v <= 0:
            return 0.0   # a constant window has no trend
        s = self.s
        if s:
            s = s - 1 if s > 0 else s + 1
        return s / math.sqrt(v / 18.0)

    def trend_tau(self) -> float:
        n = len(self.xs)
        n0 = n * (n - 1) // 2
        d = n0 - self.tp
        if n < 3 or d <= 0:
            return 0.0 if n >= 3 else NAN
        return self.s / math.sqrt(n0 * d)

    def slope(self) -> float:
        """Least-squares slope per step."""
        n = len(self.xs)
        if n < 2:
            return NAN
        var = self.stt - self.st1 * self.st1 / n
        if var <= 0:
            return NAN
        return (self.std - self.st1 * self.s1 / n) / var


def _signal_reader(sig: str, win: Window | None, trk: Track, window: int,
                   cycle: "CycleRise | None", level: Window | None) -> Callable[[], float]:
    """A function of the (synced) window giving the signal's value now."""
    if sig == "value":
        return lambda: trk.values[-1] if trk.smooth else trk.cur
    if sig == "ema":
        return lambda: trk.ema(window)
    if sig == "cycle_rise":
        return lambda: cycle.out
    if sig == "follow_z":
        def f():
            z = win.sync().trend_z()
            other = cycle.sync()
            if other.track.last_step != trk.last_step:
                return NAN      # the second metric was not logged at this step
            return _ratio(other.trend_z(), z) if z == z and z != 0 else NAN
        return f
    if sig == "start":
        # where the run started: the median of its first `window` steps (at least 3 points)
        return lambda: trk.baseline(window)
    if sig == "ratio_to_start":
        def f():
            level.sync()
            return _ratio(level.median(), trk.baseline(window))
        return f
    if sig == "start_z":
        def f():
            level.sync()
            return _zscore(level.median(), trk.baseline(window), trk.baseline_stat(window, 1))
        return f
    if sig == "gain_t":
        def f():
            w = win.sync()
            n_r = len(w.xs)
            n_b = trk.baseline_stat(window, 2)
            if n_r < 2 or not n_b >= 2:
                return NAN
            med_r = w.median()
            s_r = robust_scale(w.xs, med_r)
            s_b = trk.baseline_stat(window, 1)
            # the standard error of a median is ~1.2533 x that of a mean
            se = MEAN_AD_SCALE * math.sqrt(s_r * s_r / n_r + s_b * s_b / n_b)
            return _zscore(med_r, trk.baseline(window), se)
        return f
    if sig == "noise_ratio":
        def f():
            w = win.sync()
            hit = w.cache.get("noise")
            if hit is not None and hit[0] == trk.total:
                return hit[1]
            out = _ratio(diff_scale(w.xs), trk.baseline_stat(window, 4))
            w.cache["noise"] = (trk.total, out)
            return out
        return f
    if sig == "ratio_to_start_max":
        def f():
            level.sync()
            return _ratio(level.median(), trk.baseline_stat(window, 3))
        return f
    if sig == "delta":
        return lambda: trk.values[-1] - trk.values[-2] if len(trk.values) >= 2 else NAN
    if sig == "jump_t":
        # the mean of the window's last quarter (at least JUMP_BLOCK_POINTS points) against
        # that of as many points just before them, in the standard error of that difference. A
        # reward scattering by quarters (a few answers per step) hides a crash to half its level
        # from shift_z and jump_dz, which compare one point's level with one point's noise; the
        # mean of a dozen points shows it. Two adjacent blocks: a slow slide of the same size
        # (a format-learning dip over 40 steps) moves a quarter of a 50-step window little
        def f():
            w = win.sync()
            hit = w.cache.get("jump_t")
            if hit is not None and hit[0] == trk.total:
                return hit[1]
            xs = w.xs
            n = len(xs)
            k = n // 4
            if k < JUMP_BLOCK_POINTS:
                out = NAN
            else:
                head = list(islice(xs, 0, n - k))
                # the means of the two blocks without each block's lowest and highest point
                # (medians of a reward logged in quarters move by whole quarters; a mean moves
                # by a sixth of one outlier, which a smooth reward's spread reads as a crash);
                # each mean's standard error is sigma / sqrt(k - 2), sigma the standard
                # deviation of the points before the quarter, trend and wander included: a
                # reward that wanders (a reward model's score, 0.6 for 30 steps, 1.5 for 30,
                # then 0) has blocks further apart than its point-to-point noise says, and one
                # mostly at 0.75 with a few 0.25s has a robust scale that leaves those out
                d = _trimmed_sum(islice(xs, n - k, n)) - _trimmed_sum(head[-k:])
                se = _sample_std(head) * math.sqrt(2.0 / (k - 2))
                out = _zscore(d / (k - 2), 0.0, se)
            w.cache["jump_t"] = (trk.total, out)
            return out
        return f
    if sig in ("shift_z", "level_ratio", "shift_rel", "range_pos", "level_to_max", "ratio_to_max",
               "over_max_z", "shift_dz", "jump_dz", "shift_gain", "drawdown_gain"):
        def split() -> list:
            """[level, reference median, reference (sorted), k level points, scale or None],
            once per new point (the scale only when a signal asks for it)."""
            w = win.sync()
            hit = w.cache.get("split")
            if hit is not None and hit[0] == trk.total:
                return hit[1]
            xs, st = w.xs, w.st
            n = len(xs)
            edge = st[-1] - LEVEL_STEPS
            k = 0
            while k < n and st[n - 1 - k] > edge:
                k += 1
            k = max(k, LEVEL_POINTS)
            if n - k < SPLIT_REF_POINTS:
                out = [NAN, NAN, None, k, NAN]
            else:
                last = [xs[n - 1 - i] for i in range(k)]
                ref = list(w.sorted)       # the window's sorted values without the level's
                for x in last:
                    del ref[bisect_left(ref, x)]
                out = [median_of(sorted(last)), median_of(ref), ref, k, None]
            w.cache["split"] = (trk.total, out)
            return out

        def ref_scale(sp: list) -> float:
            if sp[4] is None:
                sp[4] = robust_scale(sp[2], sp[1])
            return sp[4]

        if sig == "shift_z":
            def f():
                sp = split()
                return NAN if sp[2] is None else _zscore(sp[0], sp[1], ref_scale(sp))
            return f
        if sig == "level_ratio":
            def f():
                sp = split()
                return _ratio(sp[0], sp[1])
            return f
        if sig == "shift_rel":
            def f():
                sp = split()
                return _ratio(sp[0] - sp[1], abs(sp[1]))
            return f
        if sig == "level_to_max":
            def f():
                sp = split()
                return NAN if sp[2] is None else _ratio(sp[0], sp[2][-1])
            return f
        def noise_z(sp: list, center: float) -> float:
            """The level against ``center`` in the reference's point-to-point noise."""
            if sp[2] is None:
                return NAN
            xs = win.xs
            return _zscore(sp[0], center, diff_scale(islice(xs, 0, len(xs) - sp[3])))

        if sig == "over_max_z":
            # a trend, however steep, climbs past the reference's maximum by a step or two of
            # its noise at a time; a jump does not
            def f():
                sp = split()
                return noise_z(sp, sp[2][-1] if sp[2] is not None else NAN)
            return f
        if sig == "shift_dz":
            # shift_z in that noise: a window stretched to its points over a learning curve (a
            # run logged every 20 steps) has a robust scale that is mostly the trend, which
            # hides a crash; the scale of the changes is not
            def f():
                sp = split()
                return noise_z(sp, sp[1])
            return f
        if sig == "jump_dz":
            # the level against the level just before it (the median of as many points before
            # the level's), in that noise: a crash is a jump between two adjacent levels, and
            # the reference's median lags it by half the climb a learning curve made in the
            # window (a run logged every 20 steps has a window of 320 steps)
            def f():
                sp = split()
                if sp[2] is None:
                    return NAN
                xs, k = win.xs, sp[3]
                n = len(xs)
                before = sorted(islice(xs, max(n - 2 * k, 0), n - k))
                return noise_z(sp, median_of(before))
            return f
        if sig == "shift_gain":
            # the change in the run's own unit: what it has moved since its start (its first
            # START_STEPS steps) plus that start's spread (a start that already climbed counts
            # that climb; a run that has not moved has its start's noise as its unit). A reward
            # model's zero is arbitrary (shift_rel reads a fall of 0.5 from 2.5 as a fifth of the
            # fall from 0.5); what the run gained and lost is not
            def f():
                sp = split()
                if sp[2] is None:
                    return NAN
                unit = trk.gain_unit(sp[1])
                d = sp[0] - sp[1]
                return 0.0 if unit == 0 and d == 0 else _ratio(d, unit)
            return f
        if sig == "drawdown_gain":
            # how much of the run's best gain it has given back: the level against the best
            # level of the window's earlier points (the largest median of 3 points in a row, so
            # one high point is not a best), in what the run had gained at that best since its
            # start (plus that start's spread). A fall that takes longer than the window, or a
            # run logged so sparsely that the window stretches over its learning curve, has half
            # its fall or the climb in the reference's median; the best level has neither
            def f():
                sp = split()
                if sp[2] is None:
                    return NAN
                best = NAN
                a = b = NAN
                for i, c in enumerate(islice(win.xs, 0, len(win.xs) - sp[3])):
                    if i >= 2:
                        m = max(min(a, b), min(max(a, b), c))
                        if not m <= best:
                            best = m
                    a, b = b, c
                unit = trk.gain_unit(best)
                d = sp[0] - best
                return 0.0 if unit == 0 and d == 0 else _ratio(d, unit)
            return f
        if sig == "range_pos":
            def f():
                sp = split()
                srt = win.sorted
                lo, hi = srt[0], srt[-1]
                return (sp[0] - lo) / (hi - lo) if hi > lo else NAN
            return f

        def f():
            w = win.sync()
            xs = w.xs
            if len(xs) < 2:
                return NAN
            # the largest |x| of the window before the newest point is at one of its ends: the
            # window's sorted values without (one copy of) the newest
            x, srt = xs[-1], w.sorted
            lo = srt[1] if srt[0] == x else srt[0]
            hi = srt[-2] if srt[-1] == x else srt[-1]
            return _ratio(abs(x), max(abs(lo), abs(hi)))
        return f
    sync = win.sync
    if sig == "median":
        return lambda: sync().median()
    if sig == "min":
        return lambda: sync().sorted[0]
    if sig == "max":
        return lambda: sync().sorted[-1]
    if sig == "range":
        def f():
            srt = sync().sorted
            return srt[-1] - srt[0]
        return f
    if sig == "mean":
        return lambda: sync().mean_std()[0]
    if sig == "std":
        return lambda: sync().mean_std()[1]
    if sig == "trend_z":
        return lambda: sync().trend_z()
    if sig == "trend_tau":
        return lambda: sync().trend_tau()
    if sig == "slope":
        return lambda: sync().slope()
    if sig == "ratio_to_median":
        def f():
            before = sync().median_before()
            return _ratio(win.xs[-1], before)
        return f
    if sig == "zscore":
        def f():
            m, s = sync().mean_std(skip_last=True)
            x = win.xs[-1]
            if s != s:
                return NAN
            return (x - m) / s if s > 0 else (0.0 if x == m else math.copysign(math.inf, x - m))
        return f
    if sig == "robust_z":
        def f():
            sync()
            med = win.median_before()
            rest = list(win.xs)[:-1]
            mad = median_of(sorted(abs(v - med) for v in rest)) * 1.4826
            x = win.xs[-1]
            return (x - med) / mad if mad > 0 else (0.0 if x == med else math.copysign(math.inf, x - med))
        return f
    if sig == "rel_drop":
        def f():
            peak = sync().sorted[-1]
            return (peak - win.xs[-1]) / abs(peak) if peak else NAN
        return f
    if sig == "rel_rise":
        def f():
            low = sync().sorted[0]
            return (win.xs[-1] - low) / abs(low) if low else NAN
        return f
    if sig == "flat_range":
        def f():
            srt = sync().sorted
            m = win.mean_std()[0]
            return (srt[-1] - srt[0]) / abs(m) if m else NAN
        return f
    if sig in ("rel_trend", "trend_gain"):
        # the climb across the window as a share of the level (rel_trend), or in the run's own
        # unit (trend_gain, shift_gain's): what the run moved since its start, plus that
        # start's spread
        share_of_level = sig == "rel_trend"

        def f():
            sync()
            span = win.st[-1] - win.st[0] + 1
            if span < window // 2:
                return NAN
            climb = win.slope() * window
            if share_of_level:
                return climb / max(abs(win.median()), 1e-12)
            unit = trk.gain_unit(win.median())
            return _ratio(climb, unit)
        return f
    if sig == "level_change":
        def f():
            sync()
            xs, st = win.xs, win.st
            if st[-1] - st[0] + 1 < window // 2:
                return NAN
            v = list(xs)
            k = max(5, len(v) // 10)
            return _ratio(median_of(sorted(v[-k:])), median_of(sorted(v[:k]))) - 1.0
        return f
    if sig in ("sign_flip_rate", "diff_ratio"):
        def both() -> tuple[float, float]:
            """(sign flip rate, diff ratio), once per new point."""
            sync()
            hit = win.cache.get("flip")
            if hit is not None and hit[0] == trk.total:
                return hit[1]
            v = win.xs
            n = len(v)
            d = list(map(sub, islice(v, 1, None), v))
            if len(d) < 2:
                out = (NAN, NAN)
            else:
                pairs = list(filter(None, map(mul, d, islice(d, 1, None))))
                flips = sum(1 for p in pairs if p < 0) / len(pairs) if pairs else NAN
                # population std of the changes over that of the values (about 1.4 for noise,
                # up to 2 for a pure oscillation, near 0 for a smooth trend)
                # (squares multiplied, not raised to a power: a value over 1e154 makes them
                # infinite, and ** would raise OverflowError out of the run's event)
                c = v[0]
                x = [a - c for a in v]
                s1 = sum(x) / n
                sx = math.sqrt(max(0.0, sum(map(mul, x, x)) / n - s1 * s1))
                m = len(d)
                sd1 = sum(d) / m
                sd = math.sqrt(max(0.0, sum(map(mul, d, d)) / m - sd1 * sd1))
                scale = max(map(abs, v))
                out = (flips, sd / (sx + 1e-12 * scale) if scale > 0 else 0.0)
            win.cache["flip"] = (trk.total, out)
            return out
        if sig == "sign_flip_rate":
            return lambda: both()[0]
        return lambda: both()[1]
    if sig == "autocorr":
        every = max(1, window // 20)

        def f():
            # the dominant period of a long window moves slowly: worked out again once the run is
            # window/20 steps on (steps, not points: a run logging every 20 steps at each point)
            if win.cache_at >= 0 and 0 <= trk.last_step - win.cache_at < every:
                return win.cache.get("ac", NAN)
            win.cache_at = trk.last_step
            win.cache["ac"] = out = _autocorr(list(sync().xs))
            return out
        return f
    raise ValueError(f"unknown signal {sig!r}")


def _autocorr(v: list[float]) -> float:
    """Strength of the dominant autocorrelation lag: on the detrended window (least-squares
    line removed), the largest autocorrelation at a lag of 2 to n/2 points that is a local peak
    of the autocorrelation function (a period) after its first fall to zero or below; 0 when
    there is none. A period's function falls below zero half a period on and peaks again at
    the period; a drifting series (red noise, a learning curve's bend) falls slowly from lag 1,
    and its noise makes small local peaks at high values on the way down: they are no period
    (every healthy simulated GRPO run logged every step had one over 0.5).

    Plain loops, each sum left to right: the native bank (``autocorr`` in native/src/lib.rs)
    does the same operations in the same order and gives the same number to the last bit
    (numpy's dot products sum in an order of their own)."""
    n = len(v)
    if n < 8:
        return NAN
    s = 0.0
    for x in v:
        s += x
    mean = s / n
    y = [x - mean for x in v]
    total = 0.0
    for a in y:
        total += a * a
    c = (n - 1) / 2.0
    ty = tt = 0.0
    for i, a in enumerate(y):
        t = i - c
        ty += t * a
        tt += t * t
    b = ty / tt
    y = [a - (i - c) * b for i, a in enumerate(y)]
    denom = 0.0
    for a in y:
        denom += a * a
    if not denom > 1e-24 * total or total == 0:
        return NAN
    m = min(n // 2 + 1, n - 1)
    r = []
    for k in range(m + 1):
        acc = 0.0
        for a, z in zip(y[k:], y):
            acc += a * z
        r.append(acc / denom)
    best = None
    crossed = r[1] <= 0.0
    for k in range(2, m):
        rk = r[k]
        if crossed and rk >= r[k - 1] and rk >= r[k + 1] and (best is None or rk > best):
            best = rk
        crossed = crossed or rk <= 0.0
    return 0.0 if best is None else best


class CycleRise:
    """Rise of a metric within its update cycle (``cycle_metric``, an epoch counter, restarts):
    the rise since the cycle's first logged value, or, when larger, the rise of the last cycle
    that ended, for the whole cycle. A run that logs every few steps sees only some epochs of
    each cycle (every 5 steps, epochs 0 and 5 of 8, then 2 and 7, ...), so an ended cycle's rise
    over the epochs it was seen at is carried to the run's whole cycle: per epoch, times the
    epochs from the lowest counter seen to the highest."""

    __slots__ = ("cycle_metric", "start", "start_cycle", "last_cycle", "last", "lo", "hi", "done",
                 "out")

    def __init__(self, cycle_metric: str):
        self.cycle_metric = cycle_metric
        self.start = self.start_cycle = self.last_cycle = self.last = self.out = NAN
        self.lo = self.hi = self.done = NAN

    def update(self, x: float, metrics: dict) -> None:
        c = metrics.get(self.cycle_metric, NAN)
        if self.start != self.start or (c == c and self.last_cycle == self.last_cycle
                                        and c <= self.last_cycle):
            # a cycle ended: its rise per epoch, over the epochs of a whole cycle
            seen = self.last_cycle - self.start_cycle
            if seen > 0 and self.hi - self.lo >= seen:
                self.done = (self.last - self.start) * ((self.hi - self.lo) / seen)
            self.start, self.start_cycle = x, c
        if c == c:
            if not c >= self.lo:
                self.lo = c
            if not c <= self.hi:
                self.hi = c
        self.last_cycle, self.last = c, x
        rise = x - self.start
        self.out = self.done if self.done > rise else rise

    def to_state(self) -> list:
        return [_enc(v) for v in (self.start, self.last_cycle, self.out, self.start_cycle, self.last,
                                  self.lo, self.hi, self.done)]

    def load(self, vals: list) -> None:
        """A state's values; a state of an older worker holds the first three (no ended cycle
        counted: the next one that ends is)."""
        if len(vals) not in (3, 8):
            raise ValueError("a cycle of a state holds three or eight values")
        vals = [_dec(v) for v in vals] + [NAN] * (8 - len(vals))
        (self.start, self.last_cycle, self.out, self.start_cycle, self.last, self.lo, self.hi,
         self.done) = vals


#: A rise of a ramp (see Ramp) counts when it exceeds the high by more than this share of it:
#: a schedule's rounding is not a rise.
RAMP_RISE = 1e-6


class Ramp:
    """Where a metric last rose above its high: the end of its ramp (a learning rate's warm-up
    ends where it stops setting new highs; a constant or decaying rate has none, nor has its
    first point). ``after_warmup_of`` counts ``after_warmup_steps`` (or ``min_steps``) from there."""

    __slots__ = ("peak", "step")

    def __init__(self):
        self.peak = NAN
        self.step: int | None = None

    def update(self, step: int, x: float) -> None:
        if not x <= self.peak + RAMP_RISE * abs(self.peak):    # the first point: peak is NaN
            if self.peak == self.peak:
                self.step = step
            self.peak = x

    def to_state(self) -> list:
        return [_enc(self.peak), self.step]

    def load(self, peak, step) -> None:
        self.peak, self.step = _dec(peak), (None if step is None else int(step))


class Bank:
    """The tracks and windows of one rank of one run."""

    def __init__(self):
        self.step = -1                          # the step being evaluated
        self.version = 0                        # bumped whenever the values change (update, load)
        self.tracks: dict[tuple, Track] = {}     # (metric, smooth) -> Track
        self.by_metric: dict[str, list[Track]] = {}
        self.windows: dict[tuple, Window] = {}   # (metric, smooth, window, points) -> Window
        self.cycles: dict[tuple, CycleRise] = {}  # (metric, cycle_metric) -> CycleRise
        self.ramps: dict[str, Ramp] = {}          # metric -> Ramp (after_warmup_of)
        self.readers: dict[tuple, Callable[[], float]] = {}

    def track(self, metric: str, smooth: int | None) -> Track:
        t = self.tracks.get((metric, smooth))
        if t is None:
            t = self.tracks[(metric, smooth)] = Track(metric, smooth)
            self.by_metric.setdefault(metric, []).append(t)
        return t

    def metric(self, metric, signal, window, smooth, cycle_metric, min_steps, min_points,
               ready_points=1, after_warmup_of=None, after_warmup_steps=None):
        """A reader of ``signal`` of ``metric`` (see rules.compile.Source); shared by every
        condition that reads the same thing."""
        key = (metric, signal, window, smooth, cycle_metric, min_steps, min_points, ready_points,
               after_warmup_of, after_warmup_steps)
        reader = self.readers.get(key)
        if reader is not None:
            return reader
        trk = self.track(metric, smooth)
        win = level = cycle = None
        if signal == "ema":
            if window not in trk.ema_spans:
                trk.ema_spans.append(window)
        elif signal == "follow_z":
            win = self.window(trk, window, min_points)
            win.need_mk()
            other = self.window(self.track(cycle_metric, smooth), window, min_points)
            other.need_mk()
            cycle = other     # handed to the reader in the cycle slot
        elif signal == "trend_gain":
            trk.baselines.setdefault(START_STEPS, [])
            win = self.window(trk, window, min_points)
            win.need_sums()
            win.need_sorted()
        elif signal in ("gain_t", "noise_ratio", "shift_gain", "drawdown_gain"):
            trk.baselines.setdefault(START_STEPS if signal in ("shift_gain", "drawdown_gain") else window, [])
            win = self.window(trk, window, min_points)
            win.need_sorted()
        elif signal == "start":
            trk.baselines.setdefault(window, [])       # the baseline alone: no level to keep
        elif signal in ("ratio_to_start", "start_z", "ratio_to_start_max"):
            trk.baselines.setdefault(window, [])
            level = self.window(trk, LEVEL_STEPS, LEVEL_POINTS)
            level.need_sorted()
        elif signal == "cycle_rise":
            cycle = self.cycles.setdefault((metric, cycle_metric), CycleRise(cycle_metric))
        elif signal in ("value", "delta"):
            trk.need(1, 2)
        else:
            win = self.window(trk, window, min_points)
            if signal in ("mean", "std", "zscore", "slope", "rel_trend", "flat_range"):
                win.need_sums()
            if signal in ("trend_z", "trend_tau"):
                win.need_mk()
            elif signal in ("median", "min", "max", "range", "ratio_to_median", "robust_z", "rel_drop",
                            "rel_rise", "flat_range", "rel_trend", "shift_z", "level_ratio",
                            "shift_rel", "range_pos", "level_to_max", "over_max_z", "shift_dz",
                            "jump_dz", "ratio_to_max"):
                win.need_sorted()
        value = _signal_reader(signal, win, trk, window, cycle, level)
        need_points = max(ready_points, min(min_steps, 5))
        warm = max(0, min_steps - 1)
        ramp = None if after_warmup_of is None else self.ramps.setdefault(after_warmup_of, Ramp())
        ramp_warm = max(0, (min_steps if after_warmup_steps is None else after_warmup_steps) - 1)
        bank = self
        memo = [-1, NAN]    # [bank version, value]: tiers and rules reading the same signal

        def read() -> float:
            if trk.last_step != bank.step:
                return NAN               # not logged at this step
            x = trk.cur
            if x - x != 0.0:
                return x                 # NaN: undecided; +/-Inf: the comparison decides
            if trk.n < need_points or bank.step - trk.first_step < warm:
                return NAN
            if ramp is not None and ramp.step is not None and bank.step - ramp.step < ramp_warm:
                return NAN               # the warm-up counts from the end of the ramp
            if memo[0] == bank.version:
                return memo[1]
            v = memo[1] = value()
            memo[0] = bank.version
            return v
        self.readers[key] = read
        return read

    def window(self, trk: Track, steps: int, points: int) -> Window:
        """The window of ``steps`` steps and at least ``points`` points on ``trk``, shared by
        the readers that ask for both alike. Not by a reader that asks for fewer points: a
        5-step max of 2 points shared with a level of 3 would read 3 (a rule's numbers must not
        depend on which other rules the pack holds)."""
        key = (trk.metric, trk.smooth, steps, points)
        w = self.windows.get(key)
        if w is None:
            w = self.windows[key] = Window(trk, steps, points)
        trk.need(steps, points)
        return w

    def update(self, step: int, metrics: dict[str, float]) -> None:
        """Push one step's metrics into the tracks that rules read."""
        self.step = step
        self.version += 1
        by_metric = self.by_metric
        for metric, x in metrics.items():
            tracks = by_metric.get(metric)
            if tracks is not None:
                for t in tracks:
                    t.push(step, x)
        for (metric, _), cyc in self.cycles.items():
            x = metrics.get(metric)
            if x is not None and x - x == 0.0:
                cyc.update(x, metrics)
        for metric, ramp in self.ramps.items():
            x = metrics.get(metric)
            if x is not None and x - x == 0.0:
                ramp.update(step, x)

    def smoothed(self) -> dict[str, float]:
        """The EMA of each metric that rules read smoothed (the shortest span), as they read it."""
        out: dict[str, tuple[int, float]] = {}
        for (metric, smooth), t in self.tracks.items():
            spans = [(s, t.ema(s)) for s in t.ema_spans]
            if smooth:
                spans.append((smooth, t.smoothed()))
            for span, v in spans:
                if v == v and (metric not in out or span < out[metric][0]):
                    out[metric] = (span, v)
        return {m: v for m, (_, v) in sorted(out.items())}

    def to_state(self) -> dict:
        return {"tracks": [[m, s, t.to_state()] for (m, s), t in self.tracks.items() if t.n or
                           t.last_step is not None],
                "cycles": [[m, c, x.to_state()] for (m, c), x in self.cycles.items()],
                "ramps": [[m, *r.to_state()] for m, r in self.ramps.items()],
                # the step each autocorrelation was last worked out at, and its value: it is
                # worked out every window/20 steps, so a restored run keeps the same rhythm
                "autocorr": [[m, s, steps, w.cache_at, _enc(w.cache.get("ac", NAN))]
                             for (m, s, steps, _), w in self.windows.items() if w.cache_at >= 0]}

    def to_msgpack(self) -> bytes:
        """``to_state()`` as MessagePack (the native bank writes the same bytes itself)."""
        return msgspec.msgpack.encode(self.to_state())

    def load(self, state: dict) -> None:
        """Restore values into the tracks this bank was compiled with (others are dropped)."""
        self.version += 1
        for m, s, st in state.get("tracks", []):
            t = self.tracks.get((m, s))
            if t is not None:
                t.load(st)
        for m, c, vals in state.get("cycles", []):
            x = self.cycles.get((m, c))
            if x is not None:
                x.load(vals)
        for item in state.get("ramps", []):     # none in a state of an older worker
            if len(item) != 3:
                raise ValueError("a ramp of a state is [metric, peak, step]")
            r = self.ramps.get(item[0])
            if r is not None:
                r.load(item[1], item[2])
        for m, s, steps, at, ac in state.get("autocorr", []):
            # the autocorrelation's window: of those of (metric, smooth, steps), the one with the
            # most points (an autocorrelation reads at least 24, more than any other signal)
            w = None
            for key, x in self.windows.items():
                if key[:3] == (m, s, steps) and (w is None or x.points > w.points):
                    w = x
            if w is not None:
                w.cache_at = int(at)
                w.cache["ac"] = _dec(ac)


# -- which Bank: the native one (streams/_native, built from native/ in Rust) when it is built --
#: the pure Python Bank above: the reference the native one must match number for number
PyBank = Bank
_NATIVE_MISSING: str | None = None
if os.environ.get("RLWATCH_NATIVE", "1") != "0":
    try:
        from streams._native import Bank as _NativeBank
    except ImportError as e:   # not built: no Rust toolchain when the package was installed
        _NATIVE_MISSING = str(e)
    else:
        Bank = _NativeBank  # type: ignore[misc, assignment]
#: the implementation of Bank in use: "native" or "pure"
CORE = "native" if Bank is not PyBank else "pure"


def core_note() -> str | None:
    """A one-line warning when the native core is missing (None when it is in use, or when
    RLWATCH_NATIVE=0 asked for the pure one)."""
    if CORE == "native" or _NATIVE_MISSING is None:
        return None
    return ("the native core is not built (no Rust toolchain at install time): detection runs "
            "about 2 times slower; see README")
