"""Everything rlwatch remembers about one run, and what happens to it per event. Pure.

:class:`RunState` is the one owner of per-run state: the worker, ``replay``, the demo and the
dashboard read the same object. It is small, bounded and serialisable (it lives in a Faust
table between events and survives a worker restart): the signals of the ranks that rules
watch, the alert states, the checkpoints, the last steps and times seen per rank, a short
buffer of per-rank values for cross-rank checks, the statistics of dists and groups and a few
per-prompt tallies. :meth:`RunState.apply` takes one event through it: bookkeeping, statistics,
the compiled rules whose inputs arrived, alerts out.

**Relaunch.** An event whose ``incarnation`` differs from the run's (the SDK draws a fresh one
per start of the training program) is a relaunch, taken at the new incarnation's first step
event (a heartbeat before it carries the SDK's step 0, whatever the checkpoint). A first step
past the run's first steps (more than :data:`RELAUNCH_STEPS_BACK`) resumed the run from a
checkpoint: as after a rollback, its statistics stay, without the points of the steps from there
on (the timeline it left), so a run preempted and resumed is still judged against its own
start. A first step back at the run's start starts the run afresh: steps seen, windows,
baselines and alert states are reset. Either way its open alerts are closed with resolved
notices ("relaunched from a checkpoint", "relaunched (its steps started over)"); checkpoints,
tags and targets stay (those after the checkpoint go). Without the field a relaunch is inferred
when a step event of rank 0 goes back more than :data:`RELAUNCH_STEPS_BACK` steps with a
timestamp later than any event of the run (a re-read Kafka message has its old timestamp; a
restarted program has a new one); under the same incarnation such a step is the script's step
count going back (a second phase of training counting from 0 again), taken the same way. A
rollback (``generation`` tag) keeps the windows up to the step gone back to and forgets steps
and alerts.

**Two programs, one run id.** The events of a program the run was relaunched from (a retired
incarnation) are strays: dropped and counted (``strays``), never a relaunch back, so the
run's statistics are not rewound or reset at every switch between two programs that share
its id. A stray sent more than :data:`STRAY_GRACE` seconds after the takeover means that
program is still running: the run gets one orange notice (``run_id_shared``) naming both.
When the program that took the run over has been quiet for :data:`STRAY_TAKEBACK` seconds,
the other takes it back as a relaunch.

**Limits.** Steps are at most ``2**53`` (the parser), a step more than :data:`MAX_STEP_JUMP`
ahead of the run's newest step and a rank beyond :data:`MAX_RANKS` are rejected
(:class:`contract.events.EventError`, one line, dead-lettered); a timestamp more than
:data:`MAX_TS_AGE` seconds before or :data:`MAX_TS_AHEAD` after the receive time is not epoch
seconds from a sane clock and is replaced by the receive time; tags (:data:`MAX_RUN_TAGS`),
remembered metric names, checkpoints, prompts and pending rank steps are bounded.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from operator import mul
from typing import Any, Callable

import msgspec
from msgspec import Raw

from contract.alert import SEVERITIES, Alert, severity_rank
from contract.events import EventError, StepEvent
from contract.presets import PRESETS, Preset, guess_preset
from rules.compile import Program, RuleList, every_rule, kl_lines, per_rule
from rules.engine import RunRules, advance_hits, evaluate
from rules.state import AlertState
from streams import signals
from streams.ranks import RankBuffer
from streams.signals import NAN, Bank
from streams.text import repetition_score

__all__ = ["MAX_RANKS", "MAX_STEP_JUMP", "RunState", "SUMMARY_METRICS", "TARGET_TAG_PREFIX"]

MAX_CHECKPOINTS = 64
#: the newest checkpoints a run's summary shows, and the longest path it shows
SUMMARY_CHECKPOINTS = 16   # (an operator's --to-step names one of these)
MAX_SUMMARY_PATH = 256
MAX_PROMPTS = 2000
MAX_PENDING_STEPS = 8
MAX_LATEST_METRICS = 512   # metric names remembered per run (a run logging ever new names)
MAX_RUN_TAGS = 64
MAX_RANKS = 4096
MAX_STEP_JUMP = 1_000_000
MAX_TS_AGE = 30 * 86400.0
MAX_TS_AHEAD = 3600.0
RELAUNCH_STEPS_BACK = 10
#: the incarnations a run remembers it was relaunched from (their programs' events are strays)
MAX_RETIRED = 4
#: a stray event this many seconds after the takeover: the program relaunched over is still
#: running (its last buffered events, sent as it stopped, come earlier)
STRAY_GRACE = 60.0
#: a stray program takes the run back when the program that took it over has sent nothing for
#: this many seconds (it ended, or was a short test under the same run id)
STRAY_TAKEBACK = 300.0
#: the alert key of the notice that two programs write under one run id (rule/severity/rank)
SHARED_KEY = "run_id_shared/orange/"
PRESET_TRIES = 5           # first step events read to find the framework of unmapped names
GROUP_TREND_EVERY = 10
#: steps over which a group's scatter (its noise unit) is remembered: e^-1 of its weight is left
#: after this many steps, long enough that a run logged every 20 steps has some 50 second
#: differences in it, short enough to follow a run whose noise changes
GROUP_NOISE_MEMORY = 300.0
#: points a category's trend is drawn through, at the least: a group's window stretches back
#: over more steps until it holds them. Through 3 points (a run logged every 40 steps, a 100-step
#: window) a slope and the scatter about it are noise: two simulated runs with step numbers
#: doubled, logged every 20 and 40 steps, read one category as "falling outright" at their
#: third and fourth points
GROUP_POINTS = 5
MAX_CATEGORIES = 64      # categories of a group metric followed (the others are left out)
#: Events may carry per-run targets as tags, e.g. {"target.kl": "0.03"} (the SDK's targets=).
TARGET_TAG_PREFIX = "target."
#: The metrics RunState.summary() shows the latest value of (when logged).
SUMMARY_METRICS = ("kl/mean", "reward/mean", "reward/std", "entropy/mean", "loss/policy",
                   "loss/value", "ppo/clip_frac", "response/length_mean",
                   "response/truncated_frac", "grad_norm/actor", "grad_norm/critic",
                   "lr/actor", "gpu/mem_allocated_gb", "kl/beta")


def _finite(xs) -> list[float]:
    return [x for x in xs if x - x == 0.0]


class _Moments:
    """Statistics of one step's per-sample array, computed once per step when read (plain
    Python: for the few hundred samples of a step it is faster than numpy's per-call cost)."""

    __slots__ = ("xs", "n", "mean", "m2", "m3", "m4", "_sorted")

    def __init__(self, xs: list[float]):
        n = len(xs)
        s = sum(xs)
        if s - s != 0.0:      # a NaN or an infinity among the samples: leave them out
            xs = [x for x in xs if x - x == 0.0]
            n, s = len(xs), sum(xs)
        self.xs, self.n, self._sorted = xs, n, None
        if n:
            m = self.mean = s / n
            d = [x - m for x in xs]
            d2 = list(map(mul, d, d))
            self.m2 = sum(d2) / n
            self.m3 = sum(map(mul, d2, d)) / n
            self.m4 = sum(map(mul, d2, d2)) / n

    def value(self, stat: str, cap: float | None) -> float:
        n = self.n
        if n == 0:
            return NAN
        if stat in ("mean", "ratio_to_start"):
            return self.mean
        if stat == "std":
            return math.sqrt(self.m2 * n / (n - 1)) if n > 1 else NAN
        if stat in ("skewness", "bimodality"):
            if n < 3 or self.m2 <= 0:
                return NAN
            try:
                g1 = self.m3 / self.m2 ** 1.5 * math.sqrt(n * (n - 1.0)) / (n - 2.0)
                if stat == "skewness":
                    return g1
                if n < 4:
                    return NAN
                g2 = ((n * n - 1.0) * self.m4 / (self.m2 * self.m2) - 3.0 * (n - 1.0) ** 2) / ((n - 2.0) * (n - 3.0))
                return (g1 * g1 + 1.0) / (g2 + 3.0 * (n - 1.0) ** 2 / ((n - 2.0) * (n - 3.0)))
            except (OverflowError, ZeroDivisionError):
                return NAN   # samples near the ends of the float range (1e103, 1e-160): no shape
        if stat == "max":
            return max(self.xs)
        if stat in ("median", "p99"):
            if self._sorted is None:
                self._sorted = sorted(self.xs)
            q = 0.5 if stat == "median" else 0.99
            pos = q * (n - 1)
            lo = int(pos)
            hi = min(lo + 1, n - 1)
            return self._sorted[lo] + (self._sorted[hi] - self._sorted[lo]) * (pos - lo)
        if stat == "tail_mass":
            return NAN if cap is None else sum(1 for x in self.xs if x > cap) / n
        if stat == "tail_over_median":    # the tail in the batch's own unit
            if cap is None:
                return NAN
            edge = cap * self.value("median", None)
            return sum(1 for x in self.xs if x > edge) / n
        if stat == "frac_at_cap":
            return NAN if cap is None else sum(1 for x in self.xs if x >= cap) / n
        raise ValueError(f"unknown dist stat {stat!r}")


def py_spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation of two per-sample arrays (ties ranked in order of
    appearance, which keeps it to one sort per array). Plain Python: for the few hundred
    samples of a step it is faster than numpy's per-call cost. The reference of the native
    ``spearman`` (native/src/dists.rs), used when that is not built."""
    n = len(x)
    if n != len(y):
        return NAN
    sx, sy = sum(x), sum(y)
    if sx - sx != 0.0 or sy - sy != 0.0:    # a NaN or an infinity: compare the finite pairs
        keep = [i for i in range(n) if x[i] - x[i] == 0.0 and y[i] - y[i] == 0.0]
        x, y, n = [x[i] for i in keep], [y[i] for i in keep], len(keep)
    if n < 3 or max(x) == min(x) or max(y) == min(y):
        return NAN
    rx = [0] * n
    for r, i in enumerate(sorted(range(n), key=x.__getitem__)):
        rx[i] = r
    ry = [0] * n
    for r, i in enumerate(sorted(range(n), key=y.__getitem__)):
        ry[i] = r
    d2 = sum([(a - b) * (a - b) for a, b in zip(rx, ry)])
    return 1.0 - 6.0 * float(d2) / (n * (n * n - 1.0))


class PySeries:
    """The points ``[step, value]`` of one series of a group (a category, or the gap between
    the categories), oldest first, and their least-squares slope per step. The reference of
    the native ``Series`` (native/src/dists.rs)."""

    __slots__ = ("pts",)

    def __init__(self, points=None):
        self.pts = [[int(s), float(x)] for s, x in points] if points else []

    def append(self, step: int, value: float) -> None:
        self.pts.append([step, value])

    def trim(self, edge: int, keep: int) -> None:
        """Drop the oldest points whose step is at most ``edge``, keeping at least ``keep``."""
        pts = self.pts
        if len(pts) > keep and pts[0][0] <= edge:
            i, most = 1, len(pts) - keep
            while i < most and pts[i][0] <= edge:
                i += 1
            del pts[:i]

    def __len__(self) -> int:
        return len(self.pts)

    def span(self) -> int:
        """Steps from the first point to the last, both counted; 0 when empty."""
        return self.pts[-1][0] - self.pts[0][0] + 1 if self.pts else 0

    def last(self) -> float:
        return self.pts[-1][1] if self.pts else NAN

    def slope(self) -> float:
        return _ls_slope([p[0] for p in self.pts], [p[1] for p in self.pts])

    def curvature(self, after: int) -> tuple[float, int]:
        """``(sum of squares, count)`` of the second differences ``x[i] - 2 x[i-1] + x[i-2]``
        of the points ``i`` whose step is above ``after`` (a straight trend gives 0: what is
        left is the series' scatter, 6 times its variance for independent noise)."""
        pts, ss, n = self.pts, 0.0, 0
        i = len(pts)
        while i > 2 and pts[i - 1][0] > after:
            d2 = pts[i - 1][1] - 2.0 * pts[i - 2][1] + pts[i - 3][1]
            ss += d2 * d2
            n += 1
            i -= 1
        return ss, n

    def to_list(self) -> list:
        return [list(p) for p in self.pts]

    def to_msgpack(self) -> bytes:
        """``to_list()`` as MessagePack (the native series writes the same bytes itself)."""
        return msgspec.msgpack.encode(self.to_list())


class PyStepView:
    """The step at hand as a run's rules read it besides its signals: whether its metrics are
    all finite and the moments of its per-sample arrays, each worked out once per step, and
    the trends of its groups, which the run sets (:meth:`set` at each step, then
    :meth:`set_group`). The reference of the native ``StepView`` (native/src/view.rs), whose
    readers stand in for Python closures the rule scan called."""

    __slots__ = ("metrics", "dists", "_finite", "_moments", "_groups")

    def __init__(self):
        self.set(_NOTHING, _NOTHING)

    def set(self, metrics: dict, dists: dict) -> None:
        self.metrics, self.dists, self._finite, self._moments, self._groups = (
            metrics, dists, None, {}, {})

    def set_group(self, key: str, trends: tuple) -> None:
        """The trends of the step's group ``key`` (:meth:`RunState.group_trends`)."""
        self._groups[key] = trends

    def finite(self) -> bool:
        if self._finite is None:
            self._finite = _all_finite(self.metrics)
        return self._finite

    def moments(self, name: str) -> "Moments | None":
        m = self._moments.get(name, False)
        if m is False:
            xs = self.dists.get(name)
            m = self._moments[name] = None if xs is None else Moments(xs)
        return m

    def dist_stat(self, name: str, stat: str, cap: float | None) -> Callable[[], float]:
        """The reader of ``moments(name).value(stat, cap)`` (NaN without the array)."""
        def read():
            m = self.moments(name)
            return NAN if m is None else m.value(stat, cap)
        return read

    def group_stat(self, key: str, stat: str) -> Callable[[], tuple]:
        """The reader of ``(value, slopes or None)`` of group ``key`` ((nan, None) when the
        step has no such group): the slopes go into an alert's detail only when one shows."""
        def read():
            got = self._groups.get(key)
            if got is None:
                return NAN, None
            slopes, gap_slope, gap, lo, hi, unit = got
            if stat == "gap":
                return gap, None
            scale = unit if z else 1.0
            if base == "gap_slope":
                return gap_slope * scale, slopes
            if lo is None:
                return NAN, None
            if base == "min_slope":
                return lo * scale, slopes
            if base == "max_slope":
                return hi * scale, slopes
            return (hi - lo) * scale, slopes
        z = stat.endswith("_z")
        base = stat[:-2] if z else stat
        return read

    def nonfinite(self, names: list[str] | None = None) -> Callable[[], list[str]]:
        """The reader of the step's non-finite metrics among ``names`` (every metric when
        None): their names, sorted; nothing is looked at when every metric is finite."""
        def read():
            if self.finite():
                return []
            m = self.metrics
            if names is None:
                return sorted(n for n, x in m.items() if x - x != 0.0)
            return sorted(n for n in names if n in m and m[n] - m[n] != 0.0)
        return read

    def nonfinite_test(self, names: list[str] | None = None) -> Callable[[], bool]:
        """The test of a non-finite check over ``names``: whether ``nonfinite(names)`` finds
        one (the native test is read by the rule scan without a Python frame)."""
        read = self.nonfinite(names)

        def test():
            return bool(read())
        return test


#: the native versions of spearman, _Moments, PySeries and PyStepView (native/src/dists.rs,
#: view.rs), number for number the same, and the native all/any/not of compiled tests
#: (native/src/logic.rs), when the native core is in use (streams.signals.CORE)
_native_join = _native_scan = _native_compare_call = None
#: the native reader of a routine step of a rank other than 0 and what takes it into a run
#: (native/src/routine.rs; None: the pure core reads every event with
#: contract.events.read_event and applies it)
read_rank_step = _routine = None
spearman, Moments, Series, StepView = py_spearman, _Moments, PySeries, PyStepView
if signals.CORE == "native":
    from streams._native import Moments, Scan as _native_scan, Series, join as _native_join, spearman  # noqa: F811
    from streams._native import compare_call as _native_compare_call  # noqa: F811
    from streams._native import Routine, read_rank_step  # noqa: F811
    from streams._native import StepView  # noqa: F811
    _routine = Routine(MAX_TS_AGE, MAX_TS_AHEAD, MAX_RANKS, MAX_STEP_JUMP, PRESET_TRIES)

#: the most records RunState.rank_steps takes in one call (the events lane looks at its clock
#: between calls)
RANK_STEPS_AT_ONCE = 256


def _ls_slope(steps: list[int], xs: list[float]) -> float:
    n = len(xs)
    if n < 3:
        return NAN
    t0, c = steps[0], xs[0]
    t = [s - t0 for s in steps]
    d = [x - c for x in xs]
    st1, sd1 = sum(t), sum(d)
    var = sum(map(mul, t, t)) - st1 * st1 / n
    return NAN if var <= 0 else (sum(map(mul, t, d)) - st1 * sd1 / n) / var


class _Source:
    """The rules.compile.Source of one rank of a run: the bank's signals, the run's other
    statistics. Registers at compile time what the run must keep per step."""

    def __init__(self, run: "RunState", rank: int):
        self.run, self.rank, self.bank = run, rank, run.banks[rank]
        # the bank's reader and the native all/any/not called straight, without a Python frame
        # of their own in between: a run's rules call them about 200 times when compiled
        self.metric = self.bank.metric
        self.nonfinite_test = run.view.nonfinite_test
        if _native_join is not None:
            self.join, self.compare_call = _native_join, _native_compare_call

    def join(self, op, tests):
        """The native all/any/not of compiled tests (rules.compile), when the core is native."""
        return None if _native_join is None else _native_join(op, tests)

    def compare_call(self, read, kind, threshold, first):
        """The native test of a Python reader against a threshold, when the core is native."""
        return None if _native_compare_call is None else _native_compare_call(read, kind, threshold, first)

    def nonfinite(self, names):
        return self.run.view.nonfinite(names)

    def rank_stat(self, metric, stat):
        run = self.run
        run.ranks.track(metric)
        run.cross_rank = True
        return run.ranks.rank_stat(metric, stat)

    def hash_mismatch(self, name):
        run = self.run
        run.cross_rank = True
        return run.ranks.hash_mismatch(name)

    def dist_stat(self, name, stat, window, cap):
        run = self.run
        if stat == "ratio_to_start":
            run.dist_bases.setdefault(f"{name}|{window}", [])

            def read():
                m = run.moments(name)
                base = run.dist_bases.get(f"{name}|{window}")
                if m is None or not base or not isinstance(base[0], tuple) or not base[0][0]:
                    return NAN
                return m.value("mean", None) / base[0][0]
            return read

        return run.view.dist_stat(name, stat, cap)

    def corr(self, x, y, window):
        run = self.run
        key = f"{x}|{y}|{window}"
        run.corr_ema.setdefault(key, [0.0, 0.0, None])
        return lambda: (run.corr_ema[key][0] / run.corr_ema[key][1]
                        if x in run.dists and y in run.dists and run.corr_ema[key][1] > 0 else NAN)

    def group_stat(self, metric, stat, window):
        run = self.run
        key = f"{metric}|{window}"
        run.groups.setdefault(key, {"points": {}, "gap": Series()})
        return run.view.group_stat(key, stat)    # (the run sets the trends of each step's groups)

    def sample_stat(self, field, stat):
        run = self.run
        if stat == "prompt_extreme":     # kept up to date as the tallies change
            return lambda: _prompt_value(run.prompts, run.extreme_prompt())
        return lambda: sample_value(run.samples, field, stat, run.prompts)

    def seconds_since_event(self):
        run = self.run
        return lambda: (run.now - run.last_event_ts) if run.last_event_ts == run.last_event_ts else NAN

    def holds(self):
        run = self.run
        return run.holds.setdefault(self.rank, {}), lambda: run.eval_step


def _when_finite(cond) -> bool | None:
    """What a condition made only of ``nonfinite`` checks gives on a step whose metrics are all
    finite (every check then finds nothing), in the compiled conditions' three-valued logic;
    ``"other"`` when it reads anything else."""
    if cond.all is not None:
        parts = [_when_finite(c) for c in cond.all]
        if "other" in parts:
            return "other"
        return False if False in parts else None if None in parts else True
    if cond.any is not None:
        parts = [_when_finite(c) for c in cond.any]
        if "other" in parts:
            return "other"
        return True if True in parts else False if False in parts else None
    if cond.not_ is not None:
        inner = _when_finite(cond.not_)
        return inner if inner in (None, "other") else not inner
    if cond.nonfinite is not None and cond.metric is None:
        return False
    return "other"


def quiet_when_finite(program: Program) -> bool:
    """True when no step rule of ``program`` can hold on a step whose metrics are all finite
    (e.g. the rules every rank evaluates: NaN/Inf checks): such a step, with no alert open on
    the rank, changes nothing and need not be evaluated."""
    return all(cr.trigger != "step" or _quiet_when_finite(cr.rule) for cr in program.rules)


@per_rule
def _quiet_when_finite(rule) -> bool:
    return all(_when_finite(tier.when) not in (True, "other") for tier in rule.tiers)


#: what the per-step fields (metrics, dists, groups) hold between steps: empty,
#: shared, never written to
_NOTHING: dict = {}

def _all_finite(metrics: dict) -> bool:
    """Whether every value of ``metrics`` is finite, by one sum (a sum that overflowed reads
    "not finite": the readers then look value by value)."""
    total = sum(metrics.values())
    return total - total == 0.0


_KEYS: dict[str, tuple] = {}
_CORR_KEYS: dict[str, tuple] = {}


def py_update_group(points: dict, gap, cats: dict, step: int, edge: int,
                    max_categories: int, keep: int) -> None:
    """One step of a group metric's categories: every series of ``points`` (category ->
    series) and ``gap`` loses its points at or before ``edge``, keeping at least ``keep``; each
    finite value of ``cats`` joins its category's series (a new one while there are fewer than
    ``max_categories``); the gap between the largest and the smallest finite value joins
    ``gap`` when there are two. (The native ``update_group`` is the same, number for number.)"""
    for series in points.values():
        series.trim(edge, keep)
    gap.trim(edge, keep)
    finite = []
    for c, v in cats.items():
        if v - v == 0.0:
            finite.append(v)
            pts = points.get(c)
            if pts is None:
                if len(points) >= max_categories:
                    continue
                pts = points[c] = Series()
            pts.append(step, v)
    if len(finite) >= 2:
        gap.append(step, max(finite) - min(finite))


def group_noise(g: dict, step: int) -> float:
    """The scatter of a group's categories around their trends (their noise sigma), from the
    second differences of each category's points, which a straight trend does not reach:
    pooled over the categories and remembered over GROUP_NOISE_MEMORY steps, so that a run
    logged every 20 steps, with 5 points per category in a 100-step window, still has a
    steady unit. Counts the points logged since it was last asked (``g["noise"]``: sum of
    squares, count, step; kept in the run's state). NaN until 3 second differences."""
    noise = g.get("noise")
    if noise is None:
        noise = g["noise"] = [0.0, 0.0, -1]
    ss, n, through = noise
    if step > through:
        keep = math.exp(-(step - through) / GROUP_NOISE_MEMORY) if through >= 0 else 1.0
        ss, n = ss * keep, n * keep
        for series in g["points"].values():
            s2, k = series.curvature(through)
            ss += s2
            n += k
    # after a step back (a rollback keeps the points), the points already counted stay counted
    # once: the count goes on from the newest step it has seen
    noise[0], noise[1], noise[2] = ss, n, max(through, step)
    return math.sqrt(ss / (6.0 * n)) if n >= 3 else NAN


update_group = py_update_group
if signals.CORE == "native":
    from streams._native import update_group  # noqa: F811


def _split_key(key: str) -> tuple[str, int]:
    """``"name|window"`` (the keys of dist baselines and groups) as (name, window), remembered."""
    got = _KEYS.get(key)
    if got is None:
        name, window = key.rsplit("|", 1)
        got = _KEYS[key] = (name, int(window))
    return got


def _split_corr_key(key: str) -> tuple[str, str, int]:
    """``"x|y|window"`` (the keys of rank correlations) as (x, y, window), remembered."""
    got = _CORR_KEYS.get(key)
    if got is None:
        x, y, window = key.split("|")
        got = _CORR_KEYS[key] = (x, y, int(window))
    return got


def _each_rank(rule) -> bool:
    """The rules a rank other than 0 evaluates for itself."""
    return rule.scope == "each_rank"


def _series_list(series) -> list:
    return series.to_list()


def _packed_series(series) -> Raw:
    return Raw(series.to_msgpack())


#: the most a run's summary takes as JSON (the fleet store keeps one per run)
MAX_SUMMARY_BYTES = 4000


def _fit_summary(out: dict) -> dict:
    """``out`` cut to MAX_SUMMARY_BYTES of JSON: long tags, alert texts and lists make a
    summary of up to 10 KB, so its least needed parts are shortened first (the worst alerts,
    the newest checkpoints and the run's identity stay)."""
    cuts = (
        lambda o: o.update(tags=dict(list(o["tags"].items())[:4])),
        lambda o: [a.update(summary=(a["summary"] or "")[:60] or None) for a in o["open_alerts"]],
        lambda o: o.update(checkpoints=o["checkpoints"][-4:]),
        lambda o: o.update(smoothed=dict(list(o["smoothed"].items())[:8])),
        lambda o: o.update(open_alerts=o["open_alerts"][:3]),
        lambda o: [a.pop("rollback_to", None) for a in o["open_alerts"]],
        lambda o: o.update(tags={}, checkpoints=o["checkpoints"][-1:]),
    )
    for cut in cuts:
        if len(json.dumps(out)) < MAX_SUMMARY_BYTES:
            break
        cut(out)
    return out


def sane_ts(ts: float | None, now: float) -> float:
    """An event's time as the run takes it: ``now`` for none, or for one more than MAX_TS_AGE
    before or MAX_TS_AHEAD after ``now`` (no epoch seconds from a sane clock)."""
    return ts if ts is not None and now - MAX_TS_AGE <= ts <= now + MAX_TS_AHEAD else now


class RunState:
    #: look for a relaunch, a rollback and new tags on every event, not only on those that may
    #: bring one: the reference the tests compare the usual way with
    news_on_every_event = False

    def __init__(self, run_id: str, resolve: Callable[..., RunRules] | None = None, *,
                 detect_preset: bool = True):
        self.run_id = run_id
        #: (run_id, reported targets) -> the pack as it applies to this run
        self.resolve = resolve
        self.incarnation: str | None = None
        self.generation = 0        # bumped by the SDK after each rollback
        self.banks: dict[int, Bank] = {}
        self.programs: dict[int, Program] = {}
        self.rules: RunRules | None = None
        self._released = False     # release() let go of the programs: compile again on use
        self.alerts: dict[str, AlertState] = {}
        #: per rank, the onset step of each held branch now true (rules.compile.held_of)
        self.holds: dict[int, dict[str, int]] = {}
        self.eval_step = -1        # the step whose rules are being evaluated
        self._ranks_open: set[int] = set()   # ranks (other than 0) with an alert state of their own
        self.checkpoints: list[tuple[int, str]] = []
        self.last_step: dict[int, int] = {}
        self.last_other: dict[str, dict[int, int]] = {}   # samples etc.: rank -> last step
        self.last_seen: dict[int, float] = {}
        self.last_event_ts: float = NAN
        self.world_size: int = 1
        self.targets: dict[str, float] = {}     # reported by the run (target.* tags)
        self.tags: dict[str, str] = {}
        self.events = 0
        self.duplicates = 0
        self.ts_replaced = 0
        self.retired: list[str] = []    # incarnations the run was relaunched from, newest first
        self.took_over_ts = NAN         # when the current incarnation took the run over
        self.strays = 0                 # events of retired incarnations, dropped
        #: per step, each rank's values of the metrics the cross-rank rules read, and hashes
        self.ranks = RankBuffer(MAX_PENDING_STEPS)
        self.dist_bases: dict[str, list] = {}     # name|window -> [means...] or [(mean,)]
        self.corr_ema: dict[str, list] = {}       # x|y|window -> [num, den, last step]
        self.groups: dict[str, dict] = {}         # metric|window -> {points: {cat: Series}, gap: Series}
        self.prompts: dict[str, list[float]] = {}   # prompt_id -> [count, sum z, sum |z|]
        #: (the tallies it is about, the extreme prompt, its |mean z|): extreme_prompt()
        #: without a pass over every prompt per samples event; None: look again
        self._extreme: tuple | None = None
        self.latest_metrics: dict[str, float] = {}
        # the evaluation at hand (not serialised)
        self.now: float = NAN
        #: what the rules read of the step at hand besides its signals: its metrics, the
        #: moments of its dists, its groups' trends (set at each step, emptied after)
        self.view = StepView()
        #: the step's dists, for the correlation reader (set with the view)
        self.dists: dict[str, list[float]] = {}
        self.samples: list = []
        self._group_cache: dict[str, tuple] = {}
        self._dists_plan: tuple | None = None     # (_dists_work)
        self._tags_seen: dict = {}
        self._tags_obj: dict | None = None
        #: (the bytes of a tags object known to read as _tags_seen, without a "generation"
        #: tag, _tags_seen then): the native routine step (native/src/routine.rs) compares an
        #: event's tags as bytes
        self._tags_raw: tuple[bytes, dict] | None = None
        self.newest = -1                # the newest step of any rank (limits, relaunch)
        self.first_step: int | None = None   # the run's first step event (resume or start over)
        self.closed = False             # the training script closed its monitor (final heartbeat)
        self.preset: str | None = None  # the framework its metric names came from (found)
        self._renamer: Preset | None = None
        self._preset_tries = 0 if detect_preset else PRESET_TRIES
        self.cross_rank = False         # a rule compares ranks: buffer their values per step

    # -- compiled rules ------------------------------------------------------------------------
    def bind(self, rules: RunRules | None = None, *, up_to: int | None = None) -> None:
        """Compile ``rules`` (by default: resolved for this run's targets) against this run's
        statistics, keeping the values already held (``up_to``: those of the steps up to it,
        :func:`streams.signals.rewind_state`)."""
        if rules is None:
            rules = self.resolve(self.run_id, dict(self.targets), self.preset)
        kept = {r: b.to_state() for r, b in self.banks.items()} if self.banks else {}
        if up_to is not None:
            kept = {r: signals.rewind_state(st, up_to) for r, st in kept.items()}
        self.rules = rules
        self.banks, self.programs = {}, {}
        self.program(0)
        for r, st in kept.items():
            if r == 0 or self.program(r).rules:
                self.banks[r].load(st)

    def release(self) -> None:
        """Let go of the compiled rules. They read this state, so state and rules form a
        cycle, which reference counting cannot free and a worker's collector does not visit
        once frozen (streams.heap): the worker calls this when it drops the state. A state
        used after it compiles its rules again, its statistics kept."""
        if self.programs:
            self.programs = {}
            self._released = True

    def program(self, rank: int) -> Program:
        p = self.programs.get(rank)
        if p is None:
            if self.rules is None or self._released:   # compiled on first use: by then the
                self._released = False                # first event's targets are in
                self.bind(self.rules)
                p = self.programs.get(rank)
                if p is not None:
                    return p
            self.banks[rank] = Bank()
            p = self.programs[rank] = self.rules.compile(_Source(self, rank),
                                                         every_rule if rank == 0 else _each_rank)
            p.finite_gate = p.finite_gate or quiet_when_finite(p)
            p.reads_signals = bool(self.banks[rank].by_metric)
            # whether rank_step may take this rank's steps (with no alert open on the rank,
            # when its rules are read on every step)
            p.routine = not (p.reads_signals or p.by_input) and (p.finite_gate or not p.every_step)
        return p

    # -- one event -----------------------------------------------------------------------------
    def apply(self, event, now: float) -> list[Alert]:
        """Take one validated event through the run; the alerts whose state changed.
        Raises EventError for an event over the limits (see the module doc)."""
        ts = sane_ts(event.ts, now)
        if event.ts is not None and ts != event.ts:
            self.ts_replaced += 1
        rank, step, kind = event.rank, event.step, event.kind
        if rank >= MAX_RANKS:
            raise EventError(f"rank {rank} is over the limit of {MAX_RANKS} ranks per run")
        tags = event.tags
        inc = event.incarnation
        # a relaunch, a rollback, new tags: looked into only when the event may bring one (most
        # events are a rank's routine step: same incarnation, the tags already seen)
        if self.news_on_every_event or (inc is not None and inc != self.incarnation) or (tags and (
                "generation" in tags or (tags is not self._tags_obj and tags != self._tags_seen))) or (
                rank == 0 and kind == "step" and step < self.newest - RELAUNCH_STEPS_BACK):
            if self.is_stray(inc, ts):
                return self._stray(event, ts)
            out = self._news(event, ts)
        else:
            out = None
        newest = self.newest
        if newest >= 0 and step - newest > MAX_STEP_JUMP:
            raise EventError(f"step {step} is more than {MAX_STEP_JUMP} steps ahead of the "
                             f"run's newest step {newest}")
        # a run that speaks after closing its monitor is running again
        self._seen(rank, ts, kind == "heartbeat" and getattr(event, "final", False) is True)
        if kind == "step":
            if self._renamer is not None:
                event.metrics = self._renamer.map_metrics(event.metrics)
            elif self._preset_tries < PRESET_TRIES and event.metrics:
                self._find_preset(event)
            last = self.last_step.get(rank)
            if last is not None and step <= last:
                self.duplicates += 1
                return out or []   # duplicate or out-of-order: already counted, never re-evaluated
            self.last_step[rank] = step
            if step > newest:
                self.newest = step
            if self.first_step is None:
                self.first_step = step
            got = self._rank_step(event, ts) if rank else self._step(event, ts)
            return out + got if out else got
        out = out or []
        if kind == "checkpoint":
            self.add_checkpoint(step, event.path)
            return out
        if kind == "heartbeat":
            return out
        book = self.last_other.setdefault(kind, {})
        last = book.get(rank)
        if last is not None and step <= last:
            self.duplicates += 1
            return out
        book[rank] = step
        return out + self._samples(event, ts)

    def rank_step(self, event, now: float) -> list[Alert] | None:
        """A routine step of a rank other than 0 as ``streams._native.read_rank_step`` read
        it: the alerts, as :meth:`apply` gives them. None, with nothing changed, when the step
        is not routine (a new incarnation or new tags, a timestamp to replace, a duplicate, a
        run not compiled yet...): :meth:`apply` then takes the event as ``read_event`` reads
        it. Most events of a fleet take this path: its checks and bookkeeping are native
        (``Routine`` in native/src/routine.rs, whose doc lists them; :meth:`apply` is their
        reference); the rules it leaves due are evaluated here (:meth:`after_rank_steps`)."""
        got = _routine.take(self, event, now)
        if got is None:
            return None
        done, due = got
        return self.after_rank_steps(done, event if due else None) if done or due else []

    def rank_steps(self, records: list, order, pos: int, now: float,
                   keep, taken: bytearray) -> tuple[int, int, list[int], Any]:
        """Take the records (Kafka records, each ``value`` an event's bytes) at
        ``order[pos:]`` one after another while each is a routine step of this run, as
        :meth:`rank_step` takes one, without reading them into objects first; each is kept by
        ``keep`` (the snapshot recorder's ``RankKeeper``: the row ``(step, rank, raw,
        keep.unread)`` given to ``keep.append``) and marked in ``taken``. It
        stops before the first record that is not (rank 0's, another run's, anything
        :meth:`rank_step` would decline), after ``RANK_STEPS_AT_ONCE``, and after one that
        leaves rules due (the cross-rank rules of a step it completes are read natively
        first: it goes on when none holds and none has an alert state). ``(the position
        after the last record taken, how many were taken, the cross-rank buffer's steps the
        last one completed, the last one when its rank's own rules are due, else None)``:
        :meth:`after_rank_steps` gives the alerts of those."""
        p0 = self.programs.get(0)
        rules = p0.by_trigger.get("ranks") if p0 is not None else None
        return _routine.take_run(self, records, order, pos, now, keep, taken, RANK_STEPS_AT_ONCE,
                                 rules.scan(_native_scan) if rules else None)

    def after_rank_steps(self, steps: list[int], due=None) -> list[Alert]:
        """The alerts of the rules a routine rank step left due (:meth:`rank_step`,
        :meth:`rank_steps`): its rank's own rules when it has a non-finite value or an alert
        is open on the rank (``due``: the step), then the cross-rank rules of ``steps``,
        complete with it; as :meth:`apply` evaluates them."""
        out: list[Alert] = []
        if due is not None:
            out = self._rank_rules(self.programs[due.rank].every_step, due.rank, due.step,
                                   due.metrics, self.now)
        if steps:
            out += self._ranks_in(steps, self.now)
        return out

    def _seen(self, rank: int, ts: float, closed: bool) -> None:
        """An event of ``rank`` at ``ts`` is taken (``closed``: it closed the run's monitor).
        (``Routine.apply`` in native/src/routine.rs does the same for the routine rank steps
        of :meth:`rank_step`: change both.)"""
        self.now = ts
        self.events += 1
        self.last_seen[rank] = ts
        self.closed = closed
        if not ts <= self.last_event_ts:     # (NaN before the first event)
            self.last_event_ts = ts

    def _news(self, event, ts: float) -> list[Alert]:
        """What an event brings besides its values: a relaunch (a new incarnation, or rank 0's
        steps starting over), a rollback (a higher ``generation`` tag), new tags and targets.
        The alerts it closes."""
        out: list[Alert] = []
        step, inc, tags = event.step, event.incarnation, event.tags
        if (inc is not None and inc != self.incarnation) or (
                event.rank == 0 and event.kind == "step" and step < self.newest - RELAUNCH_STEPS_BACK):
            # a new incarnation is taken at its first step, whose number says whether the run
            # resumed from a checkpoint or started over (a heartbeat before it carries the SDK's
            # step 0, whatever the checkpoint)
            if event.kind == "step" or inc is None or self.incarnation is None:
                how = self._relaunched(event, ts)
                gen = self.generation
                if how == "relaunched" and inc is not None:
                    self._retire(inc, ts)
                if how and self._resumes(step):
                    out += self._close_open(step, ts, (
                        f"the run was relaunched from a checkpoint (step {step})" if how == "relaunched"
                        else f"the run's steps went back to step {step}"))
                    self.resume(inc, step)
                elif how:
                    out += self._close_open(step, ts, (
                        "the run was relaunched (its steps started over)" if how == "relaunched"
                        else "the run's steps started over"))
                    self.reset(inc)
                elif self.incarnation is None:
                    self.incarnation = inc
                if how == "went back":      # the same program: its rollbacks count on
                    self.generation = gen
        if tags:
            gen = tags.get("generation")
            if gen is not None and gen.isdigit() and int(gen) > self.generation:
                out += self._close_open(step, ts, "the run rolled back to a checkpoint")
                self.generation = int(gen)
                # a heartbeat names the step gone back to (the SDK's), any other event a step
                # of the new timeline, not checkpointed in it yet
                self._forget_steps(step if event.kind == "heartbeat" else step - 1)
            if tags is not self._tags_obj and tags != self._tags_seen:
                self._take_tags(tags)
        return out

    def _relaunched(self, event, ts: float) -> str | None:
        """Whether ``event`` relaunched the run: ``"relaunched"`` (a new incarnation, or rank 0's
        steps gone back without one), ``"went back"`` (under the same incarnation), or None."""
        inc = event.incarnation
        if inc is not None and self.incarnation is not None and inc != self.incarnation:
            return "relaunched"
        # rank 0's steps went back, with a time after every event of the run (a message Kafka
        # delivers again has its old time): a relaunch that sends no incarnation, or a script
        # whose step counter started over under the same one (a second phase of training), not
        # a rollback (a higher generation tag)
        gen = (event.tags or {}).get("generation")
        if (event.kind == "step" and event.rank == 0 and (inc is None or inc == self.incarnation)
                and event.step < self.last_step.get(0, -1) - RELAUNCH_STEPS_BACK
                and ts > self.last_event_ts
                and not (gen is not None and gen.isdigit() and int(gen) > self.generation)):
            return "relaunched" if inc is None else "went back"
        return None

    def is_stray(self, inc: str | None, ts: float) -> bool:
        """Whether an event of incarnation ``inc`` sent at ``ts`` is a stray: of a program the
        run was relaunched from, while the program that took it over is not quiet."""
        return inc in self.retired and not ts - self.last_event_ts > STRAY_TAKEBACK

    def _retire(self, inc: str, ts: float) -> None:
        """The program of incarnation ``inc`` takes the run over at ``ts``: the current one is
        retired (its later events are strays)."""
        old = self.incarnation
        self.retired = [i for i in ([old] if old is not None else []) + self.retired if i != inc][:MAX_RETIRED]
        self.took_over_ts = ts

    def _stray(self, event, ts: float) -> list[Alert]:
        """An event of a program the run was relaunched from: dropped and counted; the first
        one sent STRAY_GRACE seconds after the takeover opens the notice that two programs
        share the run id (closed by the run's next relaunch)."""
        self.strays += 1
        if not ts > self.took_over_ts + STRAY_GRACE or SHARED_KEY in self.alerts:
            return []
        step = max(self.newest, 0)
        summary = (f"two training programs send under run id {self.run_id}: incarnation "
                   f"{event.incarnation} goes on (its step {event.step}) after incarnation "
                   f"{self.incarnation} took the run over; rlwatch follows {self.incarnation} and "
                   f"drops the other's events ({self.strays} so far)")
        self.alerts[SHARED_KEY] = AlertState(status="firing", onset_step=step, onset_ts=ts,
                                             fired_step=step, summary=summary)
        return [Alert(rule="run_id_shared", severity="orange", state="firing", run_id=self.run_id,
                      step=step, onset_step=step, actions=["notify"], summary=summary,
                      diagnosis=("Each training program needs its own run id: two jobs launched "
                                 "with the same name, or a job whose earlier attempt is still "
                                 "running. Stop the stray program or relaunch one under a new "
                                 f"run id. If {self.incarnation} stops sending for "
                                 f"{STRAY_TAKEBACK:.0f} s, the other takes the run back."),
                      ts=ts)]

    def _resumes(self, step: int) -> bool:
        """A relaunch whose first step lies past the run's first steps resumed it from a
        checkpoint; one back at them started it over."""
        return self.first_step is not None and step > self.first_step + RELAUNCH_STEPS_BACK

    def _forget_steps(self, last: int) -> None:
        """The run went back to a checkpoint (a rollback, a relaunch that resumed it): the
        steps after ``last`` are trained again. Steps seen and alert states go; the statistics
        (windows, warm-up baselines) stay, without the points after ``last``: those, and the
        checkpoints after it, belong to the timeline the run left (no rollback, a rule's or an
        operator's, may go to them, and no rule reads them). The dists' warm-up means (of the
        run's start) stay; the correlations' EMAs, which hold no history to take the left
        steps out of, start over."""
        self.checkpoints = [(s, p) for s, p in self.checkpoints if s <= last]
        self.corr_ema = {k: [0.0, 0.0, None] for k in self.corr_ema}
        if self.rules is not None and self.banks:
            self.bind(self.rules, up_to=last)
        for g in self.groups.values():
            g["points"] = {c: Series([p for p in x.to_list() if p[0] <= last])
                           for c, x in g["points"].items()}
            g["gap"] = Series([p for p in g["gap"].to_list() if p[0] <= last])
        self._group_cache.clear()
        self.last_step.clear()
        self.last_other.clear()
        self.ranks.clear()
        self.alerts.clear()
        self._clear_holds()
        self._ranks_open.clear()
        self.newest = -1

    def _clear_holds(self) -> None:
        for d in self.holds.values():   # (the compiled rules hold these dicts: emptied, kept)
            d.clear()

    def resume(self, incarnation: str | None, step: int) -> None:
        """Go on watching a run relaunched from a checkpoint, its first step ``step``: as after
        a rollback, its statistics stay (a run preempted and resumed is judged against its own
        start, not against the middle of its training)."""
        self.incarnation = incarnation
        self.generation = 0
        self._forget_steps(step - 1)

    def _find_preset(self, event) -> None:
        """Runs that log a framework's own names (no SDK mapping, no --preset) are mapped onto
        the canonical names, with that framework's scales, from the first step events whose
        names say which framework it is (``contract.presets.guess_preset``; a ``preset`` tag
        names it outright)."""
        self._preset_tries += 1
        named = self.tags.get("preset") or (event.tags or {}).get("preset")
        preset = PRESETS.get(named) if named else guess_preset(event.metrics).preset
        if preset is None:
            return
        self.preset, self._renamer = preset.name, preset
        self._preset_tries = PRESET_TRIES
        self.bind(self.resolve(self.run_id, dict(self.targets), self.preset))
        event.metrics = preset.map_metrics(event.metrics)

    def reset(self, incarnation: str | None) -> None:
        """Start the run afresh (a relaunch that started its steps over): steps, windows,
        baselines and alerts go."""
        self.incarnation = incarnation
        self.generation = 0
        self.first_step = None
        self.newest = -1
        self.last_step.clear()
        self.last_other.clear()
        self.ranks.clear()
        self.alerts.clear()
        self._clear_holds()
        self._ranks_open.clear()
        self.dist_bases = {k: [] for k in self.dist_bases}
        self.corr_ema = {k: [0.0, 0.0, None] for k in self.corr_ema}
        self.groups = {k: {"points": {}, "gap": Series()} for k in self.groups}
        self._group_cache.clear()
        self.prompts.clear()
        self._extreme = None
        if self.rules is not None:
            self.banks = {}
            self.bind(self.rules)

    def _step(self, event: StepEvent, ts: float) -> list[Alert]:
        step, metrics = event.step, event.metrics
        program = self.programs.get(0) or self.program(0)
        out: list[Alert] = []
        if program.reads_signals:
            self.banks[0].update(step, metrics)
        dists, groups = event.dists, event.groups
        self.dists = dists
        self.view.set(metrics, dists)
        self._remember(metrics)
        if dists or groups:
            self._update_dists(event)
            rules = program.step_rules([*metrics, *dists, *groups])
        else:
            rules = program.step_rules(metrics)
        if rules:
            out = self._evaluate(rules, step, ts)
        if self.cross_rank and (event.world_size or self.world_size) > 1:
            done = self._take_rank_values(event)
            if done:
                out += self._ranks_in(done, ts)
        self.dists = _NOTHING
        self.view.set(_NOTHING, _NOTHING)
        return out

    def _rank_step(self, event: StepEvent, ts: float) -> list[Alert]:
        """A step of a rank other than 0: the rules every rank evaluates (in the built-in pack,
        checks for non-finite values, skipped when they cannot hold), then the buffer of what
        the cross-rank rules compare. Most events of a run are such steps, all finite and
        with nothing open on their rank: that path is kept short."""
        rank, step, metrics = event.rank, event.step, event.metrics
        program = self.programs.get(rank) or self.program(rank)
        if program.reads_signals:
            self.banks[rank].update(step, metrics)
        rules = program.every_step if not program.by_input else program.step_rules(metrics)
        out: list[Alert] = []
        if rules:
            if program.finite_gate and rank not in self._ranks_open and _all_finite(metrics):
                rules = ()     # all finite, nothing open on this rank: nothing can change
            if rules:
                out = self._rank_rules(rules, rank, step, metrics, ts)
        if self.cross_rank and (event.world_size or self.world_size) > 1:
            done = self._take_rank_values(event)
            if done:
                out += self._ranks_in(done, ts)
        return out

    def _rank_rules(self, rules, rank: int, step: int, metrics: dict, ts: float) -> list[Alert]:
        """Evaluate a rank's own rules at its step (and note whether it keeps an alert open)."""
        held = len(self.alerts)
        self.view.set(metrics, _NOTHING)
        try:
            out = self._evaluate(rules, step, ts, rank)
        finally:
            self.view.set(_NOTHING, _NOTHING)
        if len(self.alerts) != held:    # (only this rank's states came or went)
            suffix = f"/{rank}"
            if any(k.endswith(suffix) for k in self.alerts):
                self._ranks_open.add(rank)
            else:
                self._ranks_open.discard(rank)
        return out

    def _ranks_in(self, steps: list[int], ts: float) -> list[Alert]:
        """Evaluate the cross-rank rules of ``steps`` (now complete, or given up on)."""
        out: list[Alert] = []
        ranks = self.ranks
        rules = self.programs[0].by_trigger.get("ranks")
        try:
            for done in steps:
                ranks.open(done)
                if rules:
                    out += self._evaluate(rules, done, ts)
        finally:
            ranks.close()
        return out

    def _samples(self, event, ts: float) -> list[Alert]:
        self._tally(event)
        self.samples = event.samples
        out = self._evaluate(self.program(0).by_trigger.get("samples", ()), event.step, ts)
        self.samples = []
        return out

    def tick(self, now: float) -> list[Alert]:
        """Evaluate the liveness rules at wall time ``now`` (not for a run that closed its
        monitor: a finished run is silent, not stalled)."""
        if self.closed:
            return []
        self.now = now
        step = max(self.last_step.values(), default=0)
        return self._evaluate(self.program(0).by_trigger.get("tick", ()), step, now)

    def _evaluate(self, rules, step: int, ts: float, rank: int | None = None) -> list[Alert]:
        """:func:`rules.engine.evaluate` of rules of the whole run (rank 0's, the cross-rank
        ones; ``rank`` None) or of a rank's own at ``step``: with the native core, its scan
        straight (at most steps no tier needs its alert state: nothing more to do)."""
        self.eval_step = step
        if _native_scan is not None and type(rules) is RuleList:
            hits = rules.scan(_native_scan, rank)(self.alerts)
            if not hits:
                return []
            return advance_hits(self.run_id, rules, hits, self.alerts, self.rules.targets, step,
                                ts, self.checkpoint_before, rank)
        return evaluate(self.run_id, rules, self.rules.targets, self.alerts, step=step, ts=ts,
                        rank=rank, checkpoint_before=self.checkpoint_before, scanner=_native_scan)

    def _close_open(self, step: int, ts: float, reason: str) -> list[Alert]:
        """Resolved notices for every firing alert of the run (escalated ones too)."""
        out = []
        for key, st in self.alerts.items():
            if st.status != "firing":
                continue
            rule, severity, rank = key.split("/")
            severities = [severity]
            if st.escalated:
                severities.append(SEVERITIES[min(SEVERITIES.index(severity) + 1, len(SEVERITIES) - 1)])
            for sev in severities:
                out.append(Alert(rule=rule, severity=sev, state="resolved", run_id=self.run_id,
                                 rank=st.rank if st.rank is not None else (int(rank) if rank else None),
                                 step=step, onset_step=st.onset_step, value=st.value,
                                 threshold=st.threshold, metric=st.metric,
                                 summary=f"{rule} closed: {reason}", ts=ts))
        return out

    # -- bookkeeping -----------------------------------------------------------------------------
    def _take_tags(self, tags: dict[str, str]) -> None:
        self._tags_obj = tags
        if tags == self._tags_seen:
            return   # the same tags as the last event: nothing new
        self._tags_seen = dict(tags)
        changed = False
        for k, v in tags.items():
            if k.startswith(TARGET_TAG_PREFIX):
                try:
                    value = float(v)
                except ValueError:
                    continue
                name = k[len(TARGET_TAG_PREFIX):]
                if value == value and self.targets.get(name) != value and len(self.targets) < MAX_RUN_TAGS:
                    self.targets[name] = value
                    changed = True
            elif k in self.tags or len(self.tags) < MAX_RUN_TAGS:
                self.tags[k] = v
        if changed and self.resolve is not None:
            self.bind()   # thresholds follow the targets the run reported, from this event on

    def _remember(self, metrics: dict[str, float]) -> None:
        latest = self.latest_metrics
        if len(latest) + len(metrics) <= MAX_LATEST_METRICS:
            latest.update(metrics)
        else:   # nearly full: known names stay current, new ones only while there is room
            for k, v in metrics.items():
                if k in latest or len(latest) < MAX_LATEST_METRICS:
                    latest[k] = v

    def checkpoint_before(self, step: int) -> dict | None:
        """The newest checkpoint saved strictly before ``step`` (the last healthy one)."""
        best = None
        for s, p in self.checkpoints:
            if s < step:
                best = (s, p)
        return None if best is None else {"step": best[0], "checkpoint": best[1]}

    def add_checkpoint(self, step: int, path: str) -> None:
        self.checkpoints.append((step, path))
        self.checkpoints.sort()
        del self.checkpoints[:-MAX_CHECKPOINTS]

    def _take_rank_values(self, event) -> list[int]:
        """Buffer what cross-rank checks need; return the steps now complete (all ranks in).
        (``Routine.apply`` in native/src/routine.rs does the same for the steps of
        :meth:`rank_step` and :meth:`rank_steps`: change both.)"""
        world = event.world_size
        if world and world > self.world_size:
            self.world_size = min(world, MAX_RANKS)
        if self.world_size <= 1:
            return []
        return self.ranks.take(event.step, event.rank, event.metrics, event.hashes, self.world_size)

    # -- dists, groups, samples ----------------------------------------------------------------
    def moments(self, name: str) -> "Moments | None":
        return self.view.moments(name)

    def _dists_work(self) -> tuple:
        """What :meth:`_update_dists` goes through at each step, its keys split once: the
        baselines still being made, the rank correlations, the groups (made again when one of
        those tables is replaced or gains a key, and when a baseline is complete)."""
        bases, corrs, groups = self.dist_bases, self.corr_ema, self.groups
        work = self._dists_plan
        if work is None or work[0] is not bases or work[1] is not corrs or work[2] is not groups \
                or work[3] != (len(bases), len(corrs), len(groups)):
            work = self._dists_plan = (
                bases, corrs, groups, (len(bases), len(corrs), len(groups)),
                [(key, *_split_key(key)) for key, base in bases.items()
                 if not (base and isinstance(base[0], tuple))],
                [(key, *_split_corr_key(key)) for key in corrs],
                [(key, *_split_key(key)) for key in groups])
        return work

    def _update_dists(self, event: StepEvent) -> None:
        step, dists = event.step, event.dists
        bases, corrs, groups, _, making, pairs, grouped = self._dists_work()
        for key, name, window in making:
            base = bases[key]
            if base and isinstance(base[0], tuple):
                continue    # the baseline is complete
            if name not in dists:
                continue
            m = self.moments(name)
            if m is None or m.n == 0:
                continue
            if not base:
                base.append(step)   # first step of the baseline
            if step < base[0] + window or len(base) - 1 < 3:
                base.append(m.mean)
            else:
                vals = base[1:]
                base[:] = [(sum(vals) / len(vals),)]
                self._dists_plan = None     # (one baseline fewer to go through)
        for key, x, y, window in pairs:
            if x in dists and y in dists:
                r = spearman(dists[x], dists[y])
                if r == r:
                    ema = corrs[key]
                    gap = 1 if ema[2] is None else max(1, step - ema[2])
                    decay = (1.0 - 2.0 / (window + 1.0)) ** gap
                    ema[0] = decay * ema[0] + (1 - decay) * r
                    ema[1] = decay * ema[1] + (1 - decay)
                    ema[2] = step
        if grouped:
            by_metric = event.groups
            for key, metric, window in grouped:
                cats = by_metric.get(metric)
                if cats is None:
                    continue
                g = groups[key]
                if cats:
                    update_group(g["points"], g["gap"], cats, step, step - window, MAX_CATEGORIES,
                                 GROUP_POINTS)
                self.view.set_group(key, self.group_trends(key, window))   # what the rules read

    def group_trends(self, key: str, window: int) -> tuple:
        """(per-category slopes, the gap's slope, the gap, the smallest and the largest finite
        slope or None, the noise unit), recomputed every GROUP_TREND_EVERY steps (category
        trends move slowly). The noise unit turns a slope per step into the move over
        ``window`` steps in the categories' own scatter (:func:`group_noise`); NaN until
        they have shown some."""
        g = self.groups[key]
        step = self.last_step.get(0, 0)
        cached = self._group_cache.get(key)
        if cached is None or step - cached[0] >= GROUP_TREND_EVERY or step < cached[0]:
            half = window // 2
            slopes = {c: (pts.slope() if len(pts) >= GROUP_POINTS and pts.span() >= half else NAN)
                      for c, pts in g["points"].items()}
            gap = g["gap"]
            gap_slope = gap.slope() if len(gap) >= GROUP_POINTS and gap.span() >= half else NAN
            finite = [v for v in slopes.values() if v == v]
            sigma = group_noise(g, step)
            cached = self._group_cache[key] = (
                step, slopes, gap_slope, gap.last(),
                min(finite) if finite else None, max(finite) if finite else None,
                window / sigma if sigma > 0.0 else NAN)
        return cached[1:]

    def _tally(self, event) -> None:
        """Tally per-prompt reward extremes (z against the batch) for prompt_extreme_reward."""
        rewards = [s.reward for s in event.samples if s.reward is not None and math.isfinite(s.reward)]
        if len(rewards) < 3:
            return
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) or 1e-12
        for s in event.samples:
            if s.prompt_id is None or s.reward is None or not math.isfinite(s.reward):
                continue
            z = (s.reward - mean) / std
            pid = s.prompt_id[:128]
            tally = self.prompts.get(pid)
            if tally is None:
                if len(self.prompts) >= MAX_PROMPTS:
                    gone = next(iter(self.prompts))
                    self.prompts.pop(gone)
                    if self._extreme is not None and self._extreme[1] == gone:
                        self._extreme = None
                tally = self.prompts[pid] = [0, 0.0, 0.0]
            tally[0] += 1
            tally[1] += z
            tally[2] += abs(z)
            if self._extreme is not None and tally[0] >= 3:
                self._follow_extreme(pid, abs(tally[1] / tally[0]))

    def _follow_extreme(self, pid: str, size: float) -> None:
        """Keep extreme_prompt() current as ``pid``'s tally changes to |mean z| ``size``; forget
        it (a full look next time) when that cannot be told without one: the extreme prompt's
        own mean shrank, a tie (the first in order wins), a NaN."""
        prompts, best_id, best = self._extreme
        if prompts is not self.prompts:
            self._extreme = None
        elif best_id is None or best != best or size != size:
            self._extreme = None
        elif pid == best_id:
            self._extreme = (prompts, pid, size) if size >= best else None
        elif size > best:
            self._extreme = (prompts, pid, size)
        elif size == best:
            self._extreme = None

    def extreme_prompt(self) -> str | None:
        """:func:`extreme_prompt` of the run's tallies."""
        got = self._extreme
        if got is None or got[0] is not self.prompts:
            best_id = extreme_prompt(self.prompts)
            size = NAN if best_id is None else abs(self.prompts[best_id][1] / self.prompts[best_id][0])
            self._extreme = got = (self.prompts, best_id, size)
        return got[1]

    # -- what the run looks like -----------------------------------------------------------------
    def summary(self) -> dict:
        """The run at a glance, JSON-able and small (under MAX_SUMMARY_BYTES of JSON): what the
        dashboard, /metrics and the fleet store show. ``smoothed`` holds the EMA values the
        rules read."""
        targets = dict(self.rules.targets) if self.rules is not None else dict(self.targets)
        out: dict[str, Any] = {
            "run_id": self.run_id, "incarnation": self.incarnation, "generation": self.generation,
            "last_step": max(self.last_step.values(), default=None),
            "last_event_ts": None if self.last_event_ts != self.last_event_ts else self.last_event_ts,
            "events": self.events, "world_size": self.world_size,
            "tags": {k[:64]: v[:128] for k, v in list(self.tags.items())[:16]},
            "targets": {k: v for k, v in list(targets.items())[:16]},
        }
        if self.strays:      # events of a program the run was relaunched from, dropped
            out["strays"] = self.strays
        kl = self._kl_lines()
        if kl:
            out["kl_lines"] = kl
        open_alerts, worst = [], None
        for key, st in self.alerts.items():
            if st.status != "firing":
                continue
            rule, severity, _ = key.split("/")
            if st.escalated:
                severity = SEVERITIES[min(SEVERITIES.index(severity) + 1, len(SEVERITIES) - 1)]
            if worst is None or severity_rank(severity) > severity_rank(worst):
                worst = severity
            entry = {"rule": rule, "severity": severity, "onset_step": st.onset_step,
                     "step": st.fired_step, "value": _num(st.value),
                     "threshold": _num(st.threshold), "metric": st.metric,
                     "summary": (st.summary or "")[:200] or None}
            # where a rollback for it would go, as a rule's rollback action picks it (what
            # `rlwatch rollback RUN` sends when the operator names no checkpoint)
            to = self.checkpoint_before(st.onset_step) if st.onset_step is not None else None
            if to is not None and len(to["checkpoint"]) <= MAX_SUMMARY_PATH:
                entry["rollback_to"] = to
            open_alerts.append(entry)
        open_alerts.sort(key=lambda a: -severity_rank(a["severity"]))
        out["open_alerts"] = open_alerts[:10]
        # the newest checkpoints the run reported, [step, path] (a path too long to show is
        # left out, never cut)
        out["checkpoints"] = [[s, p] for s, p in self.checkpoints if len(p) <= MAX_SUMMARY_PATH][
            -SUMMARY_CHECKPOINTS:]
        out["worst"] = worst
        out["latest"] = {m: _num(self.latest_metrics[m]) for m in SUMMARY_METRICS
                         if m in self.latest_metrics}
        bank = self.banks.get(0)
        out["smoothed"] = {m: v for m, v in list((bank.smoothed() if bank else {}).items())[:24]}
        return _fit_summary(out)

    def _kl_lines(self) -> dict[str, float]:
        rr = self.rules
        return {} if rr is None else kl_lines(rr.rules, rr.targets, rr.params)

    # -- state ----------------------------------------------------------------------------------
    def to_state(self, packed: bool = False) -> dict:
        """The run as plain data (what :meth:`from_state` takes back). ``packed``: each rank's
        statistics as ready MessagePack (``msgspec.Raw``, written by the bank itself: for
        :func:`streams.state_codec.encode_state`, which gives the same bytes either way), and
        so is each series of a group."""
        if packed:
            banks = {str(r): Raw(b.to_msgpack()) for r, b in self.banks.items()}
            series = _packed_series
        else:
            banks = {str(r): b.to_state() for r, b in self.banks.items()}
            series = _series_list
        return {
            "run_id": self.run_id,
            "incarnation": self.incarnation,
            "banks": banks,
            "alerts": {k: v.to_state() for k, v in self.alerts.items()},
            "checkpoints": self.checkpoints,
            "last_step": {str(k): v for k, v in self.last_step.items()},
            "last_other": {kind: {str(r): s for r, s in d.items()} for kind, d in self.last_other.items()},
            "last_seen": {str(k): v for k, v in self.last_seen.items()},
            "last_event_ts": None if math.isnan(self.last_event_ts) else self.last_event_ts,
            "world_size": self.world_size,
            "generation": self.generation,
            "first_step": self.first_step,
            "targets": self.targets,
            "tags": self.tags,
            "events": self.events,
            "duplicates": self.duplicates,
            "ts_replaced": self.ts_replaced,
            "retired": self.retired,
            "took_over_ts": None if math.isnan(self.took_over_ts) else self.took_over_ts,
            "strays": self.strays,
            "closed": self.closed,
            "preset": self.preset,
            # how many step events were read for a framework's names: a restarted worker goes
            # on from there, as this one would (not 5 more tries, which also cost a restore
            # about a tenth of its time)
            "preset_tries": self._preset_tries,
            "pending": self.ranks.to_state(),
            "rank_held": self.ranks.held_state(),
            "dist_bases": {k: ([{"m": v[0][0]}] if v and isinstance(v[0], tuple) else v)
                           for k, v in self.dist_bases.items()},
            "corr_ema": self.corr_ema,
            "groups": {k: {"points": {c: series(p) for c, p in g["points"].items()},
                           "gap": series(g["gap"]), "noise": list(g.get("noise", ()))}
                       for k, g in self.groups.items()},
            "prompts": self.prompts,
            "latest_metrics": {k: v for k, v in self.latest_metrics.items() if math.isfinite(v)},
            **({"holds": {str(r): dict(d) for r, d in self.holds.items() if d}}
               if any(self.holds.values()) else {}),
        }

    @classmethod
    def from_state(cls, state: dict, resolve: Callable[..., RunRules], *,
                   detect_preset: bool = True) -> "RunState":
        rs = cls(state["run_id"], resolve, detect_preset=detect_preset)
        rs.incarnation = state.get("incarnation")
        rs.preset = state.get("preset")
        if rs.preset in PRESETS:
            rs._renamer, rs._preset_tries = PRESETS[rs.preset], PRESET_TRIES
        else:   # (a state from an older worker has no count: the tries start over)
            tries = state.get("preset_tries", 0)
            if type(tries) is int:
                rs._preset_tries = min(PRESET_TRIES, max(rs._preset_tries, tries))
        rs.targets = state.get("targets", {})
        rs.bind()
        for r, b in state.get("banks", {}).items():
            r = int(r)
            if r == 0 or rs.program(r).rules:
                rs.banks[r].load(b)
        rs.alerts = {k: AlertState.from_state(v) for k, v in state.get("alerts", {}).items()}
        for r, d in state.get("holds", {}).items():     # (into the dicts the rules read)
            rs.holds.setdefault(int(r), {}).update({str(k): int(v) for k, v in d.items()})
        rs._ranks_open = {int(r) for r in (k.rsplit("/", 1)[1] for k in rs.alerts) if r.isdigit()}
        rs.checkpoints = [tuple(c) for c in state.get("checkpoints", [])]
        rs.last_step = {int(k): v for k, v in state.get("last_step", {}).items()}
        rs.newest = max(rs.last_step.values(), default=-1)
        rs.last_other = {kind: {int(r): s for r, s in d.items()}
                         for kind, d in state.get("last_other", {}).items()}
        rs.last_seen = {int(k): v for k, v in state.get("last_seen", {}).items()}
        ts = state.get("last_event_ts")
        rs.last_event_ts = NAN if ts is None else ts
        rs.world_size = state.get("world_size", 1)
        rs.generation = state.get("generation", 0)
        first = state.get("first_step")     # (none in a state of an older worker)
        rs.first_step = first if type(first) is int else None
        rs.tags = state.get("tags", {})
        rs.events = state.get("events", 0)
        rs.duplicates = state.get("duplicates", 0)
        rs.ts_replaced = state.get("ts_replaced", 0)
        retired = state.get("retired")
        rs.retired = [i for i in retired if type(i) is str][:MAX_RETIRED] if type(retired) is list else []
        ts = state.get("took_over_ts")
        rs.took_over_ts = float(ts) if type(ts) in (int, float) else NAN
        rs.strays = state.get("strays", 0)
        rs.closed = state.get("closed", False)
        rs.ranks.load(state.get("pending", {}))
        rs.ranks.load_held(state.get("rank_held", {}))
        for k, v in state.get("dist_bases", {}).items():
            if k in rs.dist_bases:
                rs.dist_bases[k] = [(v[0]["m"],)] if v and isinstance(v[0], dict) else list(v)
        for k, v in state.get("corr_ema", {}).items():
            if k in rs.corr_ema:
                rs.corr_ema[k] = list(v)
        for k, v in state.get("groups", {}).items():
            if k in rs.groups:
                rs.groups[k] = {"points": {c: Series(p) for c, p in v.get("points", {}).items()},
                                "gap": Series(v.get("gap", []))}
                noise = v.get("noise")
                if isinstance(noise, list) and len(noise) == 3:
                    rs.groups[k]["noise"] = [float(noise[0]), float(noise[1]), int(noise[2])]
        rs.prompts = state.get("prompts", {})
        rs.latest_metrics = state.get("latest_metrics", {})
        return rs


def _num(x) -> float | None:
    return None if x is None or x != x or x in (math.inf, -math.inf) else float(x)


def extreme_prompt(prompts: dict) -> str | None:
    """The prompt (of 3 samples or more) whose mean reward z is largest in size, the first of
    them in the tallies' order; None when there is none."""
    best, best_id = NAN, None
    for pid, (n, zsum, _) in prompts.items():
        if n >= 3:
            mz = zsum / n
            if math.isnan(best) or abs(mz) > abs(best):
                best, best_id = mz, pid
    return best_id


def _prompt_value(prompts: dict, best_id: str | None) -> tuple[float, str | None]:
    if best_id is None:
        return NAN, None
    n, zsum, _ = prompts[best_id]
    best = zsum / n
    return abs(best), f"prompt {best_id!r} mean reward z {best:+.2f} over {int(n)} samples"


def sample_value(samples: list, field: str, stat: str, prompts: dict) -> tuple[float, str | None]:
    """One number about the latest samples (and the per-prompt tallies)."""
    if stat == "prompt_extreme":
        return _prompt_value(prompts, extreme_prompt(prompts))
    if not samples:
        return NAN, None
    if stat == "top_share":
        values = [getattr(s, field, None) for s in samples]
        values = [v for v in values if v]
        if len(values) < 3:
            return NAN, None
        token, count = Counter(values).most_common(1)[0]
        return count / len(samples), f"token {token!r} is the KL peak in {count} of {len(samples)} samples"
    if stat == "repetition":
        texts = [getattr(s, field, None) or "" for s in samples]
        texts = [t for t in texts if t]
        if not texts:
            return NAN, None
        scores = [repetition_score(t) for t in texts]
        worst = max(range(len(scores)), key=scores.__getitem__)
        return sum(scores) / len(scores), f"worst sample: {texts[worst][:80]!r}"
    raise ValueError(f"unknown samples stat {stat!r}")
